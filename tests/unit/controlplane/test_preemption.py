"""The pause decision's contract (controlplane/core/preemption.py), on hand-made and random pools."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.preemption import CellKey, CellLoad, TenantTerms, pause_levels

LENDER = TenantTerms(preemptible=False, nominal_slots=48, limit_slots=48)
BORROWER = TenantTerms(preemptible=True, nominal_slots=48, limit_slots=48)


def test_a_queued_lender_has_borrowed_work_paused_by_what_it_is_owed() -> None:
    # B runs 80 where it may now admit 48; A queues 10 and is granted only the 16 it runs.
    cells = {
        ("g1", "A"): CellLoad(in_flight=16, queued=10, target=48, grant=16),
        ("g1", "B"): CellLoad(in_flight=80, queued=40, target=48, grant=48),
    }
    assert pause_levels({"A": LENDER, "B": BORROWER}, cells) == {("g1", "B"): 70}


def test_nothing_is_paused_when_no_tenant_is_owed() -> None:
    cells = {
        ("g1", "A"): CellLoad(in_flight=16, queued=0, target=48, grant=16),
        ("g1", "B"): CellLoad(in_flight=80, queued=40, target=48, grant=48),
    }
    assert pause_levels({"A": LENDER, "B": BORROWER}, cells) == {}


def test_a_borrower_that_did_not_opt_in_is_never_paused() -> None:
    cells = {
        ("g1", "A"): CellLoad(in_flight=16, queued=10, target=48, grant=16),
        ("g1", "B"): CellLoad(in_flight=80, queued=40, target=48, grant=48),
    }
    not_preemptible = TenantTerms(preemptible=False, nominal_slots=48, limit_slots=48)
    assert pause_levels({"A": LENDER, "B": not_preemptible}, cells) == {}


def test_work_within_the_borrowers_own_share_is_never_paused() -> None:
    # B's limit fell below its share (A storms and was given 70), but B keeps its own 48.
    lender = TenantTerms(preemptible=False, nominal_slots=48, limit_slots=70)
    borrower = TenantTerms(preemptible=True, nominal_slots=48, limit_slots=26)
    cells = {
        ("g1", "A"): CellLoad(in_flight=40, queued=60, target=70, grant=40),
        ("g1", "B"): CellLoad(in_flight=56, queued=40, target=26, grant=26),
    }
    assert pause_levels({"A": lender, "B": borrower}, cells) == {("g1", "B"): 48}


def test_pauses_follow_the_excess_at_each_gateway() -> None:
    cells = {
        ("g1", "A"): CellLoad(in_flight=0, queued=12, target=24, grant=0),
        ("g2", "A"): CellLoad(in_flight=0, queued=0, target=24, grant=0),
        ("g1", "B"): CellLoad(in_flight=60, queued=0, target=24, grant=24),
        ("g2", "B"): CellLoad(in_flight=36, queued=0, target=24, grant=24),
    }
    levels = pause_levels({"A": LENDER, "B": BORROWER}, cells)
    assert levels == {("g1", "B"): 51, ("g2", "B"): 33}


def test_a_tenant_cut_somewhere_is_not_owed_elsewhere() -> None:
    # B queues at g2 below its target there while it runs above its grant at g1: B is being
    # cut, so nothing is paused for it (another preemptible tenant C would pay otherwise).
    c = TenantTerms(preemptible=True, nominal_slots=16, limit_slots=16)
    cells = {
        ("g1", "B"): CellLoad(in_flight=40, queued=0, target=20, grant=20),
        ("g2", "B"): CellLoad(in_flight=0, queued=9, target=20, grant=0),
        ("g1", "C"): CellLoad(in_flight=30, queued=0, target=16, grant=16),
    }
    assert pause_levels({"B": BORROWER, "C": c}, cells) == {}


_tenant_names = ("A", "B", "C", "D")
_gateway_names = ("g1", "g2", "g3")


@st.composite
def _pools(draw: st.DrawFn) -> tuple[dict[str, TenantTerms], dict[CellKey, CellLoad]]:
    names = draw(st.lists(st.sampled_from(_tenant_names), min_size=1, max_size=4, unique=True))
    gateways = draw(st.lists(st.sampled_from(_gateway_names), min_size=1, max_size=3, unique=True))
    tenants = {
        name: TenantTerms(
            preemptible=draw(st.booleans()),
            nominal_slots=draw(st.integers(0, 64)),
            limit_slots=draw(st.integers(0, 96)),
        )
        for name in names
    }
    cells = {}
    for gateway in gateways:
        for name in names:
            target = draw(st.integers(0, 64))
            cells[(gateway, name)] = CellLoad(
                in_flight=draw(st.integers(0, 96)),
                queued=draw(st.integers(0, 32)),
                target=target,
                grant=draw(st.integers(0, target)),
            )
    return tenants, cells


@settings(max_examples=400, deadline=None)
@given(_pools())
def test_the_contract_holds_on_random_pools(
    pool: tuple[dict[str, TenantTerms], dict[CellKey, CellLoad]],
) -> None:
    tenants, cells = pool
    levels = pause_levels(tenants, cells)
    assert levels == pause_levels(tenants, cells)
    paused: dict[str, int] = {}
    for (gateway, name), level in levels.items():
        cell = cells[(gateway, name)]
        assert tenants[name].preemptible
        assert cell.grant <= level < cell.in_flight
        paused[name] = paused.get(name, 0) + cell.in_flight - level
    cut = {name for (_, name), cell in cells.items() if cell.in_flight > cell.grant}
    owed = 0
    for (_, name), cell in cells.items():
        if name in cut or cell.queued == 0:
            continue
        owed += max(
            0, min(cell.target, cell.in_flight + cell.queued) - max(cell.grant, cell.in_flight)
        )
    assert sum(paused.values()) <= owed
    for name, count in paused.items():
        running = sum(c.in_flight for (_, t), c in cells.items() if t == name)
        terms = tenants[name]
        assert running - count >= max(terms.limit_slots, terms.nominal_slots)
