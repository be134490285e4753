"""The pause decision's contract (controlplane/core/preemption.py), on hand-made and random pools."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.preemption import CellKey, CellLoad, TenantTerms, pause_levels

LENDER = TenantTerms(preemptible=False, nominal_slots=48, limit_slots=48, queued_slots=4)
"""A lender that wants its share back: requests of it wait."""
BORROWER = TenantTerms(preemptible=True, nominal_slots=48, limit_slots=48)


def test_borrowed_work_above_the_limit_is_paused_at_once() -> None:
    # B runs 80 where the decision now gives it 48 (A wants its share back).
    cells = {
        ("g1", "A"): CellLoad(in_flight=16, grant=16),
        ("g1", "B"): CellLoad(in_flight=80, grant=48),
    }
    assert pause_levels({"A": LENDER, "B": BORROWER}, cells) == {("g1", "B"): 48}


def test_a_borrower_within_its_limit_is_not_paused() -> None:
    cells = {("g1", "B"): CellLoad(in_flight=60, grant=60)}
    borrowing = TenantTerms(preemptible=True, nominal_slots=48, limit_slots=60)
    assert pause_levels({"B": borrowing}, cells) == {}


def test_a_borrower_that_did_not_opt_in_is_never_paused() -> None:
    cells = {
        ("g1", "A"): CellLoad(in_flight=16, grant=16),
        ("g1", "B"): CellLoad(in_flight=80, grant=48),
    }
    not_preemptible = TenantTerms(preemptible=False, nominal_slots=48, limit_slots=48)
    assert pause_levels({"A": LENDER, "B": not_preemptible}, cells) == {}


def test_work_within_the_borrowers_own_share_is_never_paused() -> None:
    # B's limit fell below its share (A storms and was given 70), but B keeps its own 48.
    lender = TenantTerms(preemptible=False, nominal_slots=48, limit_slots=70, queued_slots=30)
    borrower = TenantTerms(preemptible=True, nominal_slots=48, limit_slots=26)
    cells = {
        ("g1", "A"): CellLoad(in_flight=40, grant=40),
        ("g1", "B"): CellLoad(in_flight=56, grant=26),
    }
    assert pause_levels({"A": lender, "B": borrower}, cells) == {("g1", "B"): 48}


def test_pauses_follow_the_excess_at_each_gateway() -> None:
    borrower = TenantTerms(preemptible=True, nominal_slots=48, limit_slots=84)
    waiting = TenantTerms(preemptible=False, nominal_slots=48, limit_slots=12, queued_slots=3)
    cells = {
        ("g1", "B"): CellLoad(in_flight=60, grant=42),
        ("g2", "B"): CellLoad(in_flight=36, grant=30),
    }
    # 96 run where 84 may: 12 paused, 18:6 by the excess at each gateway.
    assert pause_levels({"A": waiting, "B": borrower}, cells) == {
        ("g1", "B"): 51,
        ("g2", "B"): 33,
    }


def test_nothing_is_paused_while_no_other_tenant_has_demand() -> None:
    # A decision met a lull (every tenant between two requests) and gave the nominal shares
    # back; B's requests came right after. A neither runs nor waits: pausing B would free
    # slots and engine time nobody uses.
    idle = TenantTerms(preemptible=False, nominal_slots=8, limit_slots=8)
    borrower = TenantTerms(preemptible=True, nominal_slots=8, limit_slots=8)
    cells = {
        ("g1", "A"): CellLoad(in_flight=0, grant=4),
        ("g1", "B"): CellLoad(in_flight=12, grant=4),
    }
    assert pause_levels({"A": idle, "B": borrower}, cells) == {}
    # ... until A has demand: a request of it waits, or runs.
    waiting = TenantTerms(preemptible=False, nominal_slots=8, limit_slots=8, queued_slots=1)
    assert pause_levels({"A": waiting, "B": borrower}, cells) == {("g1", "B"): 8}
    running = {**cells, ("g1", "A"): CellLoad(in_flight=1, grant=4)}
    assert pause_levels({"A": idle, "B": borrower}, running) == {("g1", "B"): 8}


def test_a_split_that_moved_between_gateways_pauses_nothing() -> None:
    # Pool-wide B runs within its limit; only the split between the gateways moved.
    borrower = TenantTerms(preemptible=True, nominal_slots=16, limit_slots=40)
    cells = {
        ("g1", "B"): CellLoad(in_flight=30, grant=20),
        ("g2", "B"): CellLoad(in_flight=5, grant=20),
    }
    assert pause_levels({"B": borrower}, cells) == {}


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
            queued_slots=draw(st.integers(0, 3)),
        )
        for name in names
    }
    cells = {}
    for gateway in gateways:
        for name in names:
            cells[(gateway, name)] = CellLoad(
                in_flight=draw(st.integers(0, 96)), grant=draw(st.integers(0, 64))
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
    for name, terms in tenants.items():
        mine = [c for (_, t), c in cells.items() if t == name]
        running = sum(c.in_flight for c in mine)
        over = sum(max(0, c.in_flight - c.grant) for c in mine)
        wanted = running - max(terms.limit_slots, terms.nominal_slots)
        others_want_room = any(
            other.wants_room(sum(c.in_flight for (_, t), c in cells.items() if t == name_other))
            for name_other, other in tenants.items()
            if name_other != name
        )
        expected = max(0, min(over, wanted)) if terms.preemptible and others_want_room else 0
        assert paused.get(name, 0) == expected, name
        assert running - paused.get(name, 0) >= min(running, terms.nominal_slots)
