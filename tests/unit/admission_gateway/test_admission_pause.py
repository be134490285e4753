"""Pausing and resuming in TenantAdmission: youngest first, a bounded number of times, ahead of
the queue, never failed, and every request ends exactly once."""

from __future__ import annotations

import asyncio
import functools
import random

import pytest

from admission_gateway.admission import AdmissionClosed, QueueFull, Slot, TenantAdmission
from slotshift.clock import ManualClock


def _admission(
    clock: ManualClock, limit: int, *, max_pauses: int = 2, depth: int = 8
) -> TenantAdmission:
    return TenantAdmission(
        "B",
        limit,
        queue_max_depth=depth,
        queue_timeout_s=1.0,
        clock=clock,
        max_pauses_per_request=max_pauses,
    )


async def _admit(
    admission: TenantAdmission, clock: ManualClock, count: int, *, pausable: bool = True
) -> list[Slot]:
    slots = []
    for _ in range(count):
        clock.advance(1.0)
        slots.append(await admission.acquire(pausable=pausable))
    return slots


async def test_the_youngest_pausable_requests_are_asked_to_pause() -> None:
    clock = ManualClock()
    admission = _admission(clock, 6)
    old = await _admit(admission, clock, 2, pausable=False)
    young = await _admit(admission, clock, 4)
    called: list[int] = []
    for index, slot in enumerate(young):
        slot.on_pause(functools.partial(called.append, index))
    admission.resize(2)
    admission.set_pause_above(3)
    assert sorted(called) == [1, 2, 3], "the three youngest, not the unpausable old ones"
    assert [s.pause_requested for s in old + young] == [False, False, False, True, True, True]
    admission.set_pause_above(3)
    assert len(called) == 3, "a level: applying it again pauses nothing more"
    for slot in old + young:
        slot.release()


async def test_a_resumed_request_waits_ahead_of_new_ones_and_keeps_its_age() -> None:
    clock = ManualClock()
    admission = _admission(clock, 2)
    first, second = await _admit(admission, clock, 2)
    newcomer = asyncio.ensure_future(admission.acquire(pausable=True))
    await asyncio.sleep(0)
    admission.resize(1)
    admission.set_pause_above(1)
    assert second.pause_requested and not first.pause_requested
    resumed = asyncio.ensure_future(admission.resume(second))
    await asyncio.sleep(0)
    assert admission.paused == 1 and admission.queued == 2
    first.release()
    slot = await resumed
    assert slot.admitted_at_s == second.admitted_at_s and slot.pauses == 1
    assert not newcomer.done(), "the paused request went ahead of the one queued before"
    slot.release()
    (await newcomer).release()
    assert admission.pauses_total == 1
    assert admission.admitted_total == 3 and admission.completed_total == 3


async def test_a_request_paused_max_times_is_not_chosen_again() -> None:
    clock = ManualClock()
    admission = _admission(clock, 1, max_pauses=1)
    (slot,) = await _admit(admission, clock, 1)
    admission.set_pause_above(0)
    assert slot.pause_requested
    admission.set_pause_above(None)
    resumed = await admission.resume(slot)
    admission.set_pause_above(0)
    assert not resumed.pause_requested, "paused once already: runs to its end"
    resumed.release()


async def test_paused_requests_are_exempt_from_depth_timeout_and_close() -> None:
    clock = ManualClock()
    admission = _admission(clock, 1, depth=1)
    (slot,) = await _admit(admission, clock, 1)
    admission.resize(0)
    admission.set_pause_above(0)
    resumed = asyncio.ensure_future(admission.resume(slot))
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(admission.acquire())
    await asyncio.sleep(0)
    assert admission.queued == 2, "the paused request takes no place of the queue's depth"
    with pytest.raises(QueueFull):
        await admission.acquire()
    admission.close()
    with pytest.raises(AdmissionClosed):
        await waiting
    idle = asyncio.ensure_future(admission.wait_idle())
    await asyncio.sleep(0)
    assert not resumed.done() and not idle.done(), "the paused request still waits, not failed"
    admission.resize(1)
    (await resumed).release()
    await asyncio.wait_for(idle, 1.0)


async def test_a_paused_request_whose_client_leaves_leaves_no_trace() -> None:
    clock = ManualClock()
    admission = _admission(clock, 1)
    (slot,) = await _admit(admission, clock, 1)
    admission.resize(0)
    admission.set_pause_above(0)
    resumed = asyncio.ensure_future(admission.resume(slot))
    await asyncio.sleep(0)
    resumed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await resumed
    assert admission.queued == 0 and admission.paused == 0 and admission.in_flight == 0
    # Admitted once, ended once: a completion, not an arrival that gave up.
    assert (admission.admitted_total, admission.completed_total) == (1, 1)
    assert admission.abandoned_total == 0
    await asyncio.wait_for(admission.wait_idle(), 1.0)


@pytest.mark.parametrize("seed", range(10))
async def test_every_request_ends_exactly_once_under_random_pauses(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    admission = _admission(clock, 4, max_pauses=3, depth=64)
    ended: list[int] = []

    async def request(number: int) -> None:
        slot = await admission.acquire(pausable=True)
        while True:
            for _ in range(rng.randint(1, 4)):
                await asyncio.sleep(0)
                if slot.pause_requested:
                    break
            if not slot.pause_requested:
                break
            slot = await admission.resume(slot)
        slot.release()
        ended.append(number)

    tasks = [asyncio.create_task(request(n), name=f"request {n}") for n in range(30)]
    for _ in range(200):
        await asyncio.sleep(0)
        action = rng.random()
        if action < 0.3:
            admission.resize(rng.randint(0, 6))
        elif action < 0.6:
            admission.set_pause_above(rng.choice([None, 0, 1, 2, 3]))
    admission.set_pause_above(None)
    admission.resize(6)
    await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert sorted(ended) == list(range(30))
    assert admission.admitted_total == 30 and admission.completed_total == 30
    assert admission.in_flight == 0 and admission.queued == 0 and admission.paused == 0


async def test_a_request_moved_from_a_lost_pool_waits_as_a_paused_one_and_counts_here() -> None:
    clock = ManualClock()
    lost_pool, other = _admission(clock, 2), _admission(clock, 1, depth=1)
    (running,) = await _admit(other, clock, 1)
    newcomer = asyncio.ensure_future(other.acquire(pausable=True))
    await asyncio.sleep(0)
    (moving,) = await _admit(lost_pool, clock, 1)
    moved = asyncio.ensure_future(other.take_over(moving))
    await asyncio.sleep(0)
    assert moving.released and lost_pool.in_flight == 0, "its slot at the lost pool is free"
    assert (lost_pool.admitted_total, lost_pool.completed_total) == (1, 1)
    assert other.queued == 2 and other.paused == 1
    with pytest.raises(QueueFull):
        await other.acquire()  # the moved request takes no place of the queue's depth
    running.release()
    slot = await moved
    assert not newcomer.done(), "it went ahead of the request queued before it"
    assert slot.pausable and slot.admitted_at_s == moving.admitted_at_s and slot.pauses == 0
    assert other.paused == 0 and other.in_flight == 1
    slot.release()
    (await newcomer).release()
    assert (other.admitted_total, other.completed_total) == (3, 3), "admitted here once"


async def test_a_moved_request_is_admitted_at_once_where_there_is_room() -> None:
    clock = ManualClock()
    lost_pool, other = _admission(clock, 1), _admission(clock, 1)
    (moving,) = await _admit(lost_pool, clock, 1)
    slot = await asyncio.wait_for(other.take_over(moving), 1.0)
    assert other.in_flight == 1 and other.queued == 0
    slot.release()
    await asyncio.wait_for(other.wait_idle(), 1.0)


async def test_a_moved_request_whose_client_leaves_is_abandoned_here() -> None:
    clock = ManualClock()
    lost_pool, other = _admission(clock, 1), _admission(clock, 0)
    (moving,) = await _admit(lost_pool, clock, 1)
    moved = asyncio.ensure_future(other.take_over(moving))
    await asyncio.sleep(0)
    idle = asyncio.ensure_future(other.wait_idle())
    await asyncio.sleep(0)
    assert not idle.done(), "a request waiting to move in keeps the tenant busy here"
    other.close()
    await asyncio.sleep(0)
    assert not moved.done(), "exempt from the shutdown drain, as a paused request"
    moved.cancel()
    with pytest.raises(asyncio.CancelledError):
        await moved
    assert other.queued == 0 and other.paused == 0
    assert (other.admitted_total, other.abandoned_total) == (0, 1)
    await asyncio.wait_for(idle, 1.0)


@pytest.mark.parametrize(
    "which",
    [
        pytest.param("released", id="released"),
        pytest.param("unpausable", id="unpausable"),
        pytest.param("same-admission", id="same-admission"),
    ],
)
async def test_only_a_held_pausable_slot_of_another_admission_moves(which: str) -> None:
    clock = ManualClock()
    lost_pool, other = _admission(clock, 2), _admission(clock, 2)
    (slot,) = await _admit(lost_pool, clock, 1, pausable=which != "unpausable")
    if which == "released":
        slot.release()
    target = lost_pool if which == "same-admission" else other
    with pytest.raises(ValueError, match="another admission"):
        await target.take_over(slot)
    slot.release()
