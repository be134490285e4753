"""controlplane/core/push.py: what a gateway's next update names, and whether it may wait."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.allocation import NO_PAUSE
from controlplane.core.push import GatewayRow, next_push

TENANTS = ("A", "B", "C", "D")


def _row(targets: list[int], limits: list[int], pauses: list[int]) -> GatewayRow:
    return GatewayRow(
        TENANTS,
        np.array(targets, dtype=np.int64),
        np.array(limits, dtype=np.int64),
        np.array(pauses, dtype=np.int64),
    )


_values = st.lists(st.integers(0, 6), min_size=len(TENANTS), max_size=len(TENANTS))
_pauses = st.lists(
    st.sampled_from([NO_PAUSE, 0, 2, 4]), min_size=len(TENANTS), max_size=len(TENANTS)
)


def test_the_first_update_of_a_stream_is_whole_and_urgent() -> None:
    push = next_push(None, _row([1, 2, 3, 4], [1, 2, 3, 4], [NO_PAUSE] * 4), None)
    assert push.columns is None
    assert push.urgent


def test_other_tenants_than_last_time_get_a_whole_update() -> None:
    before = _row([1, 2, 3, 4], [1, 2, 3, 4], [NO_PAUSE] * 4)
    after = GatewayRow(("A", "B", "C"), before.targets[:3], before.limits[:3], before.pauses[:3])
    push = next_push(before, after, None)
    assert push.columns is None and push.urgent


def test_headroom_moving_may_wait_and_a_queued_tenants_raise_may_not() -> None:
    before = _row([4, 4, 0, 0], [4, 4, 0, 0], [NO_PAUSE] * 4)
    after = _row([4, 6, 0, 0], [4, 6, 0, 0], [NO_PAUSE] * 4)
    idle = np.zeros(4, dtype=np.int64)
    push = next_push(before, after, idle)
    assert push.columns is not None and push.columns.tolist() == [1]
    assert not push.urgent
    queued = np.array([0, 3, 0, 0], dtype=np.int64)
    assert next_push(before, after, queued).urgent
    assert next_push(before, after, None).urgent, "unknown queues count as queued"


@given(_values, _values, _pauses, _values, _values, _pauses, _values)
@settings(max_examples=500, deadline=None)
def test_next_push_names_exactly_what_moved_and_is_urgent_exactly_when_it_must(
    targets_before: list[int],
    limits_before: list[int],
    pauses_before: list[int],
    targets: list[int],
    limits: list[int],
    pauses: list[int],
    queued: list[int],
) -> None:
    before = _row(targets_before, limits_before, pauses_before)
    after = _row(targets, limits, pauses)
    push = next_push(before, after, np.array(queued, dtype=np.int64))
    moved = [
        i
        for i in range(len(TENANTS))
        if (targets_before[i], limits_before[i], pauses_before[i])
        != (targets[i], limits[i], pauses[i])
    ]
    assert push.columns is not None
    assert push.columns.tolist() == moved
    must = any(
        limits[i] < limits_before[i]
        or pauses[i] != pauses_before[i]
        or (limits[i] > limits_before[i] and queued[i] > 0)
        for i in moved
    )
    assert push.urgent == must
