"""controlplane/core/placement.py returns exactly what its per-cell references return.

The references are `gateway_split`, `grants` and `preemption` (each with its own contract tests);
placement is their vectorised form, so on random pools every array it returns must equal theirs
cell for cell.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.gateway_split import idle_beside as reference_idle_beside
from controlplane.core.gateway_split import rebalance as reference_rebalance
from controlplane.core.gateway_split import split_among_gateways
from controlplane.core.grants import Cell, compute_grants
from controlplane.core.placement import (
    PauseTerms,
    grant,
    idle_beside,
    largest_remainder,
    pause_levels,
    rebalance,
    resplit,
    split_targets,
)
from controlplane.core.preemption import CellLoad, TenantTerms
from controlplane.core.preemption import pause_levels as reference_pause_levels
from slotshift.apportion import Claim, apportion

GATEWAYS = [f"gw{i:02d}" for i in range(12)]
TENANTS = [f"t{i:02d}" for i in range(9)]


@st.composite
def _matrix(draw: st.DrawFn, gateways: int, tenants: int, high: int) -> np.ndarray:
    values = draw(
        st.lists(st.integers(0, high), min_size=gateways * tenants, max_size=gateways * tenants)
    )
    return np.array(values, dtype=np.int64).reshape(gateways, tenants)


@st.composite
def _shape(draw: st.DrawFn) -> tuple[int, int]:
    return draw(st.integers(1, len(GATEWAYS))), draw(st.integers(1, len(TENANTS)))


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_largest_remainder_is_apportion_for_proportional_claims(data: st.DataObject) -> None:
    weights = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=40))
    total = data.draw(st.integers(0, sum(weights)))
    expected = apportion(total, [Claim(0, w, float(w)) for w in weights]) if any(weights) else None
    got = largest_remainder(total, np.array(weights, dtype=np.int64))
    if expected is None:
        assert got.tolist() == [0] * len(weights)
    else:
        assert got.tolist() == expected


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_split_targets_equals_split_among_gateways(data: st.DataObject) -> None:
    g, t = data.draw(_shape())
    in_flight = data.draw(_matrix(g, t, 30))
    queued = data.draw(_matrix(g, t, 30))
    limits = np.array(data.draw(st.lists(st.integers(0, 200), min_size=t, max_size=t)))
    demand = {
        GATEWAYS[i]: {TENANTS[j]: (int(in_flight[i, j]), int(queued[i, j])) for j in range(t)}
        for i in range(g)
    }
    expected = split_among_gateways({TENANTS[j]: int(limits[j]) for j in range(t)}, demand)
    got = split_targets(limits.astype(np.int64), in_flight + queued)
    for i in range(g):
        for j in range(t):
            assert got[i, j] == expected[GATEWAYS[i]][TENANTS[j]], (i, j)
    targets = {GATEWAYS[i]: {TENANTS[j]: int(got[i, j]) for j in range(t)} for i in range(g)}
    moved = data.draw(_matrix(g, t, 40))
    moved_demand = {
        GATEWAYS[i]: {TENANTS[j]: (int(moved[i, j]), 0) for j in range(t)} for i in range(g)
    }
    for waiting_only in (False, True):
        columns = idle_beside(got, moved, waiting_only=waiting_only)
        expected_tenants = reference_idle_beside(targets, moved_demand, waiting_only=waiting_only)
        assert {TENANTS[j] for j in np.flatnonzero(columns)} == expected_tenants
    # A re-split moves only the named tenants, each as a whole split would.
    columns = np.array(data.draw(st.lists(st.booleans(), min_size=t, max_size=t)))
    again = resplit(limits.astype(np.int64), moved, got, columns)
    whole = split_targets(limits.astype(np.int64), moved)
    assert (again[:, columns] == whole[:, columns]).all()
    assert (again[:, ~columns] == got[:, ~columns]).all()


@given(st.data())
@settings(max_examples=400, deadline=None)
def test_rebalance_equals_the_reference_and_keeps_its_contract(data: st.DataObject) -> None:
    g, t = data.draw(_shape())
    parts = data.draw(_matrix(g, t, 12))
    demand = data.draw(_matrix(g, t, 12))
    columns = np.array(data.draw(st.lists(st.booleans(), min_size=t, max_size=t)))
    got = rebalance(demand, parts, columns)
    expected = reference_rebalance(
        {GATEWAYS[i]: {TENANTS[j]: (int(demand[i, j]), 0) for j in range(t)} for i in range(g)},
        {GATEWAYS[i]: {TENANTS[j]: int(parts[i, j]) for j in range(t)} for i in range(g)},
        {TENANTS[j] for j in range(t) if columns[j]},
    )
    for i in range(g):
        for j in range(t):
            assert got[i, j] == expected[GATEWAYS[i]][TENANTS[j]], (i, j)
    assert (got >= 0).all()
    assert (got.sum(axis=0) == parts.sum(axis=0)).all(), "each tenant's parts keep their sum"
    assert (got[:, ~columns] == parts[:, ~columns]).all(), "tenants not named keep their parts"
    after = idle_beside(got, demand, waiting_only=True)
    assert not after[columns].any(), "no request waits beside an idle part"
    moved = got - parts
    assert ((moved == 0) | (np.sign(moved) == np.sign(demand - parts))).all(), "toward demand"


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_grant_equals_compute_grants(data: st.DataObject) -> None:
    g, t = data.draw(_shape())
    targets = data.draw(_matrix(g, t, 20))
    granted = data.draw(_matrix(g, t, 20))
    bounds = data.draw(_matrix(g, t, 20))
    budget = data.draw(st.integers(0, 20 * g * t))
    cells = {
        (GATEWAYS[i], TENANTS[j]): Cell(int(targets[i, j]), int(granted[i, j]), int(bounds[i, j]))
        for i in range(g)
        for j in range(t)
    }
    expected = compute_grants(budget, cells)
    got = grant(budget, targets, granted, bounds)
    for i in range(g):
        for j in range(t):
            assert got[i, j] == expected[(GATEWAYS[i], TENANTS[j])], (i, j)


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_pause_levels_equal_the_reference(data: st.DataObject) -> None:
    g, t = data.draw(_shape())
    in_flight = data.draw(_matrix(g, t, 30))
    grants = data.draw(_matrix(g, t, 30))
    preemptible = np.array(data.draw(st.lists(st.booleans(), min_size=t, max_size=t)))
    nominal = np.array(data.draw(st.lists(st.integers(0, 100), min_size=t, max_size=t)))
    limits = np.array(data.draw(st.lists(st.integers(0, 100), min_size=t, max_size=t)))
    queued = np.array(data.draw(st.lists(st.integers(0, 2), min_size=t, max_size=t)))
    terms = {
        TENANTS[j]: TenantTerms(
            bool(preemptible[j]), int(nominal[j]), int(limits[j]), int(queued[j])
        )
        for j in range(t)
    }
    loads = {
        (GATEWAYS[i], TENANTS[j]): CellLoad(int(in_flight[i, j]), int(grants[i, j]))
        for i in range(g)
        for j in range(t)
    }
    expected = reference_pause_levels(terms, loads)
    got = pause_levels(
        PauseTerms(
            preemptible,
            nominal.astype(np.int64),
            limits.astype(np.int64),
            queued.astype(np.int64),
        ),
        in_flight,
        grants,
    )
    for i in range(g):
        for j in range(t):
            want = expected.get((GATEWAYS[i], TENANTS[j]), -1)
            assert got[i, j] == want, (i, j)


def test_no_gateways_place_nothing() -> None:
    empty = np.zeros((0, 3), dtype=np.int64)
    assert split_targets(np.array([4, 5, 6], dtype=np.int64), empty).shape == (0, 3)
    assert not idle_beside(empty, empty, waiting_only=False).any()
    assert grant(10, empty, empty, empty).shape == (0, 3)


def test_inputs_are_not_written() -> None:
    targets = np.array([[5, 0], [0, 5]], dtype=np.int64)
    granted = np.array([[0, 5], [5, 0]], dtype=np.int64)
    bounds = granted.copy()
    before = (targets.copy(), granted.copy(), bounds.copy())
    grant(10, targets, granted, bounds)
    assert all(
        np.array_equal(a, b) for a, b in zip(before, (targets, granted, bounds), strict=True)
    )
