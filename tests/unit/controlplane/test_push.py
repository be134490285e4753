"""controlplane/core/push.py: what a gateway's next update names, and whether it may wait."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.allocation import NO_PAUSE
from controlplane.core.push import GatewayRow, PushSlots, Waiting, next_push

TENANTS = ("A", "B", "C", "D")


def _row(
    targets: list[int], limits: list[int], pauses: list[int], pool: list[int] | None = None
) -> GatewayRow:
    return GatewayRow(
        TENANTS,
        np.array(targets, dtype=np.int64),
        np.array(limits, dtype=np.int64),
        np.array(pauses, dtype=np.int64),
        np.array(pool if pool is not None else [10] * len(TENANTS), dtype=np.int64),
    )


def _waiting(
    queued: list[int], lending: list[bool], *, short: bool = False, over: bool = False
) -> Waiting:
    return Waiting(np.array(queued, dtype=np.int64), np.array(lending, dtype=bool), short, over)


_values = st.lists(st.integers(0, 6), min_size=len(TENANTS), max_size=len(TENANTS))
_flags = st.lists(st.booleans(), min_size=len(TENANTS), max_size=len(TENANTS))
_pauses = st.lists(
    st.sampled_from([NO_PAUSE, 0, 2, 4]), min_size=len(TENANTS), max_size=len(TENANTS)
)


def test_the_first_update_of_a_stream_is_whole_and_urgent() -> None:
    push = next_push(None, _row([1, 2, 3, 4], [1, 2, 3, 4], [NO_PAUSE] * 4), None)
    assert push.columns is None
    assert push.urgent


def test_other_tenants_than_last_time_get_a_whole_update() -> None:
    before = _row([1, 2, 3, 4], [1, 2, 3, 4], [NO_PAUSE] * 4)
    after = GatewayRow(
        ("A", "B", "C"),
        before.targets[:3],
        before.limits[:3],
        before.pauses[:3],
        before.pool_limits[:3],
    )
    push = next_push(before, after, None)
    assert push.columns is None and push.urgent


def test_a_grant_to_a_queued_lender_goes_at_once_and_to_a_borrower_may_wait() -> None:
    before = _row([4, 4, 0, 0], [4, 4, 0, 0], [NO_PAUSE] * 4)
    after = _row([4, 6, 0, 0], [4, 6, 0, 0], [NO_PAUSE] * 4)
    idle = _waiting([0, 0, 0, 0], [True] * 4)
    push = next_push(before, after, idle)
    assert push.columns is not None and push.columns.tolist() == [1]
    assert not push.urgent, "headroom moving to an idle tenant may wait"
    assert next_push(before, after, _waiting([0, 3, 0, 0], [True] * 4)).urgent
    borrower = _waiting([0, 3, 0, 0], [True, False, True, True])
    assert not next_push(before, after, borrower).urgent, "a queued borrower's grant may wait"
    assert next_push(before, after, None).urgent, "unknown: every change counts as waited for"


def test_a_shrink_goes_at_once_when_its_slots_are_given_away_or_a_lender_waits() -> None:
    """And any change of a tenant's pool-wide limit: a decision goes to every gateway it
    changed at once."""
    before = _row([6, 4, 0, 0], [6, 4, 0, 0], [NO_PAUSE] * 4, pool=[12, 8, 0, 0])
    moved = _row([5, 4, 0, 0], [5, 4, 0, 0], [NO_PAUSE] * 4, pool=[12, 8, 0, 0])
    nobody = _waiting([0, 0, 0, 0], [False, True, True, True])
    assert not next_push(before, moved, nobody).urgent, "A's part moving to another gateway"
    lender_waits = _waiting([0, 0, 0, 0], [False, True, True, True], short=True)
    assert next_push(before, moved, lender_waits).urgent
    over = _waiting([0, 0, 0, 0], [False, True, True, True], over=True)
    assert next_push(before, moved, over).urgent, "the gateways may hold more than the budget"
    shrunk = _row([5, 4, 0, 0], [5, 4, 0, 0], [NO_PAUSE] * 4, pool=[10, 10, 0, 0])
    assert next_push(before, shrunk, nobody).urgent, "A's pool-wide limit fell: a reclaim"
    decided = _row([6, 5, 0, 0], [6, 4, 0, 0], [NO_PAUSE] * 4, pool=[10, 10, 0, 0])
    assert next_push(before, decided, nobody).urgent, "a decision's raise, though not granted yet"
    paused = _row([6, 4, 0, 0], [6, 4, 0, 0], [3, NO_PAUSE, NO_PAUSE, NO_PAUSE], pool=[12, 8, 0, 0])
    assert next_push(before, paused, nobody).urgent


@given(
    _values,
    _values,
    _pauses,
    _values,
    _values,
    _values,
    _pauses,
    _values,
    _values,
    _flags,
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=500, deadline=None)
def test_next_push_names_exactly_what_moved_and_is_urgent_exactly_when_it_must(
    targets_before: list[int],
    limits_before: list[int],
    pauses_before: list[int],
    pool_before: list[int],
    targets: list[int],
    limits: list[int],
    pauses: list[int],
    pool: list[int],
    queued: list[int],
    lending: list[bool],
    short: bool,
    over: bool,
) -> None:
    before = _row(targets_before, limits_before, pauses_before, pool_before)
    after = _row(targets, limits, pauses, pool)
    push = next_push(before, after, _waiting(queued, lending, short=short, over=over))
    moved = [
        i
        for i in range(len(TENANTS))
        if (targets_before[i], limits_before[i], pauses_before[i])
        != (targets[i], limits[i], pauses[i])
    ]
    assert push.columns is not None
    assert push.columns.tolist() == moved
    must = any(
        pauses[i] != pauses_before[i]
        or pool[i] != pool_before[i]
        or (limits[i] < limits_before[i] and (short or over))
        or (limits[i] > limits_before[i] and lending[i] and queued[i] > 0)
        for i in moved
    )
    assert push.urgent == must


def _pushed(offers: list[tuple[float, bool]], interval_s: float) -> list[tuple[float, bool]]:
    """When a gateway stream's writer sends, for updates offered at (time, urgent): an urgent one
    at once, one that may wait at its push slot, replaced by whatever comes meanwhile (the
    writer's loop in controlplane/service/gateway_service.py, in virtual time)."""
    slots = PushSlots(interval_s)
    sent: list[tuple[float, bool]] = []
    held_since: float | None = None
    index = 0
    while index < len(offers) or held_since is not None:
        due = None if held_since is None else max(held_since, slots.free_at_s)
        if index < len(offers) and (due is None or offers[index][0] < due):
            at, urgent = offers[index]
            index += 1
            if urgent:
                sent.append((at, True))
                slots.took(at)
                held_since = None
            elif held_since is None:
                held_since = at
        else:
            assert due is not None
            sent.append((due, False))
            slots.took(due)
            held_since = None
    return sent


BURST = 4
"""Urgent updates in the property test below: at most one per two intervals over time, in
bursts of up to this many at once."""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.5), st.integers(1, BURST)), min_size=1, max_size=40))
def test_push_slots_keep_a_gateway_at_one_update_an_interval_while_urgent_ones_go_at_once(
    bursts: list[tuple[float, int]],
) -> None:
    interval = 0.1
    # Something that may wait is always on offer (demand moving between gateways), and urgent
    # updates come in bursts: never held, only their own rate can bound a gateway's, so they
    # come at most once per two intervals over time (after bursts of up to BURST).
    urgent: list[tuple[float, bool]] = []
    now = 0.0
    for gap, burst in bursts:
        now += gap
        allowed = min(burst, int(now / (2 * interval) + BURST) - len(urgent))
        urgent += [(now, True)] * max(0, allowed)
    # Then a quiet tail of only what may wait, long enough to pay back any debt.
    end = now + 2 * interval * (len(urgent) + 2)
    held = [(step * interval / 10 + 1e-4, False) for step in range(int(end / interval * 10))]
    offers = sorted(urgent + held)
    sent = _pushed(offers, interval)
    assert [at for at, at_once in sent if at_once] == [at for at, at_once in offers if at_once]
    # The debt urgent updates ran up is paid back by the held ones, not forgiven: over the
    # run, one update an interval (plus the first).
    assert len(sent) <= (sent[-1][0] - sent[0][0]) / interval + 1 + 1e-9
    for (at, at_once), (before, _) in zip(sent[1:], sent, strict=False):
        if not at_once:
            # A held update waits at most two intervals after the send before it.
            assert at <= max(before + 2 * interval, _offered_before(offers, at)) + 1e-9


def _offered_before(offers: list[tuple[float, bool]], at: float) -> float:
    """The latest offer at or before `at`."""
    return max(t for t, _ in offers if t <= at + 1e-12)
