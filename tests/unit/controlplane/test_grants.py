"""compute_grants keeps the pool within its budget while slots drain between gateways."""

from __future__ import annotations

import random

from controlplane.core.grants import Cell, compute_grants


def test_contract_on_seeded_random_cases() -> None:
    rng = random.Random(7)
    for _ in range(5_000):
        budget = rng.randint(1, 200)
        cells: dict[tuple[str, str], Cell] = {}
        for g in range(rng.randint(1, 4)):
            for t in range(rng.randint(1, 4)):
                target = rng.randint(0, budget)
                granted = rng.randint(0, budget)
                bound = granted + rng.choice([0, 0, rng.randint(0, 50)])
                cells[(f"g{g}", f"t{t}")] = Cell(target=target, granted=granted, bound=bound)
        grants = compute_grants(budget, cells)
        assert set(grants) == set(cells)
        bounds_sum = sum(max(c.bound, c.granted) for c in cells.values())
        held_after = sum(max(c.bound, c.granted, grants[k]) for k, c in cells.items())
        assert held_after <= max(budget, bounds_sum)
        for key, cell in cells.items():
            assert 0 <= grants[key] <= cell.target
            if cell.granted >= cell.target:
                assert grants[key] == cell.target, "a cell above its target is cut at once"
        if sum(max(c.bound, c.target) for c in cells.values()) <= budget:
            assert all(grants[k] == c.target for k, c in cells.items())
        assert compute_grants(budget, cells) == grants


def test_raise_waits_for_the_lender_to_drain() -> None:
    # B is asked to give 44 slots to A, but B still has 92 running.
    cells = {
        ("g", "A"): Cell(target=48, granted=4, bound=4),
        ("g", "B"): Cell(target=48, granted=92, bound=92),
    }
    grants = compute_grants(96, cells)
    assert grants == {("g", "A"): 4, ("g", "B"): 48}
    # B's gateway acknowledged 48 and reports 70 still running: A may grow by 22.
    cells = {
        ("g", "A"): Cell(target=48, granted=4, bound=4),
        ("g", "B"): Cell(target=48, granted=48, bound=70),
    }
    assert compute_grants(96, cells) == {("g", "A"): 26, ("g", "B"): 48}
    # B drained to its new limit: A gets its whole target.
    cells[("g", "B")] = Cell(target=48, granted=48, bound=48)
    assert compute_grants(96, cells)[("g", "A")] == 48
