"""Reconnection delays: doubling, capped, jittered below the step, reset."""

from __future__ import annotations

import random

import pytest

from slotshift.backoff import Backoff


def test_delays_double_up_to_the_cap_and_stay_within_half_to_all_of_each_step() -> None:
    backoff = Backoff(0.2, 1.0, random.Random(7))
    delays = [backoff.next_delay_s() for _ in range(6)]
    steps = [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    for delay, step in zip(delays, steps, strict=True):
        assert step / 2 <= delay <= step


def test_jitter_spreads_agents_that_lost_the_same_control_plane() -> None:
    first = [Backoff(0.2, 5.0, random.Random(seed)).next_delay_s() for seed in range(20)]
    assert len(set(first)) == 20


def test_reset_starts_again_from_the_initial_delay() -> None:
    backoff = Backoff(0.2, 5.0, random.Random(1))
    for _ in range(5):
        backoff.next_delay_s()
    backoff.reset()
    assert backoff.next_delay_s() <= 0.2


def test_a_cap_below_the_initial_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(1.0, 0.5, random.Random())
