"""Admission core: limit, FIFO, resize, rejections, release-exactly-once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from admission_gateway.admission import (
    AdmissionClosed,
    QueueFull,
    QueueTimeout,
    Slot,
    TenantAdmission,
)
from slotshift.clock import ManualClock
from tests.support import wait_until


def make(limit: int, *, depth: int = 16, timeout_s: float = 30.0) -> TenantAdmission:
    return TenantAdmission(
        "A", limit, queue_max_depth=depth, queue_timeout_s=timeout_s, clock=ManualClock()
    )


async def queue_up(admission: TenantAdmission, count: int) -> list[asyncio.Task[Slot]]:
    """Start `count` waiters, each enqueued before the next starts."""
    tasks: list[asyncio.Task[Slot]] = []
    for _ in range(count):
        tasks.append(asyncio.create_task(admission.acquire()))
        await wait_until(lambda: admission.queued == len(tasks), interval_s=0.001)
    return tasks


async def test_admits_up_to_the_limit_then_queues() -> None:
    admission = make(2)
    first = await admission.acquire()
    second = await admission.acquire()
    [third] = await queue_up(admission, 1)
    assert (admission.in_flight, admission.queued) == (2, 1)
    assert not third.done()
    first.release()
    slot = await third
    assert (admission.in_flight, admission.queued) == (2, 0)
    second.release()
    slot.release()
    assert (admission.in_flight, admission.admitted_total, admission.completed_total) == (0, 3, 3)


async def test_it_signals_when_requests_start_to_queue_not_for_each_one() -> None:
    starts: list[int] = []
    admission = TenantAdmission(
        "A",
        1,
        queue_max_depth=16,
        queue_timeout_s=30.0,
        clock=ManualClock(),
        on_queue_started=lambda: starts.append(admission.queued),
    )
    running = await admission.acquire()
    waiters = await queue_up(admission, 3)
    assert starts == [1]
    running.release()
    for waiter in waiters:
        (await waiter).release()
    # The queue emptied: the next request that has to wait starts a new queue.
    blocker = await admission.acquire()
    [late] = await queue_up(admission, 1)
    assert starts == [1, 1]
    blocker.release()
    (await late).release()


async def test_waiters_are_admitted_in_arrival_order() -> None:
    admission = make(1)
    held = await admission.acquire()
    waiters = await queue_up(admission, 4)
    order: list[int] = []

    def record(index: int) -> Callable[[asyncio.Task[Slot]], None]:
        return lambda _task: order.append(index)

    for index, task in enumerate(waiters):
        task.add_done_callback(record(index))
    held.release()
    await wait_until(lambda: len(order) == 1, interval_s=0.001)
    assert order == [0]
    admission.resize(4)
    slots = await asyncio.gather(*waiters)
    assert order == [0, 1, 2, 3]
    for slot in slots:
        slot.release()


async def test_a_newcomer_does_not_overtake_a_granted_waiter() -> None:
    admission = make(1)
    held = await admission.acquire()
    [waiter] = await queue_up(admission, 1)
    held.release()
    # The slot was handed to the waiter although it has not run yet: nothing is free.
    assert (admission.in_flight, admission.queued) == (1, 0)
    newcomer = asyncio.create_task(admission.acquire())
    await wait_until(lambda: admission.queued == 1, interval_s=0.001)
    assert waiter.done()
    assert not newcomer.done()
    (await waiter).release()
    (await newcomer).release()
    assert admission.in_flight == 0


async def test_growing_the_limit_admits_waiters_in_order_up_to_it() -> None:
    admission = make(1)
    held = await admission.acquire()
    waiters = await queue_up(admission, 3)
    admission.resize(3)
    assert (admission.in_flight, admission.queued) == (3, 1)
    granted = [await waiters[0], await waiters[1]]
    assert not waiters[2].done()
    for slot in [held, *granted]:
        slot.release()
    (await waiters[2]).release()
    assert (admission.in_flight, admission.queued) == (0, 0)


async def test_shrinking_the_limit_cancels_nothing_and_admits_once_usage_fits() -> None:
    admission = make(3)
    running = [await admission.acquire() for _ in range(3)]
    admission.resize(1)
    assert admission.in_flight == 3
    assert not any(slot.released for slot in running)
    [waiter] = await queue_up(admission, 1)
    running[0].release()
    running[1].release()
    # in_flight 1 is not below the limit 1: still no admission.
    assert (admission.in_flight, admission.queued) == (1, 1)
    assert not waiter.done()
    running[2].release()
    slot = await waiter
    assert (admission.in_flight, admission.queued) == (1, 0)
    slot.release()


async def test_shrinking_to_zero_then_growing_again() -> None:
    admission = make(2)
    admission.resize(0)
    [waiter] = await queue_up(admission, 1)
    admission.resize(1)
    (await waiter).release()
    assert admission.in_flight == 0


async def test_a_full_queue_rejects_at_once() -> None:
    admission = make(0, depth=1)
    [waiter] = await queue_up(admission, 1)
    with pytest.raises(QueueFull):
        await admission.acquire()
    assert admission.rejected_by_reason == {"queue_full": 1, "queue_timeout": 0, "shutting_down": 0}
    assert admission.queued == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_no_queue_rejects_whatever_does_not_fit() -> None:
    admission = make(1, depth=0)
    slot = await admission.acquire()
    with pytest.raises(QueueFull):
        await admission.acquire()
    slot.release()
    (await admission.acquire()).release()
    assert admission.rejected_total == 1


async def test_a_request_that_waits_too_long_times_out_and_leaves_the_queue() -> None:
    admission = make(0, timeout_s=0.05)
    with pytest.raises(QueueTimeout):
        await admission.acquire()
    assert (admission.queued, admission.in_flight) == (0, 0)
    assert admission.rejected_by_reason["queue_timeout"] == 1
    # The timed-out request must not be admitted later.
    admission.resize(1)
    assert admission.in_flight == 0


async def test_cancellation_while_queued_leaves_no_trace() -> None:
    admission = make(1)
    held = await admission.acquire()
    [waiter] = await queue_up(admission, 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (admission.queued, admission.abandoned_total) == (0, 1)
    held.release()
    assert (admission.in_flight, admission.admitted_total, admission.completed_total) == (0, 1, 1)


async def test_cancellation_between_grant_and_run_hands_the_slot_on() -> None:
    admission = make(1)
    held = await admission.acquire()
    first, second = await queue_up(admission, 2)
    held.release()  # grants `first`, which has not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    slot = await second
    assert (admission.in_flight, admission.queued) == (1, 0)
    slot.release()
    assert (admission.in_flight, admission.admitted_total, admission.completed_total) == (0, 3, 3)


async def test_cancellation_while_running_releases_the_slot_once() -> None:
    admission = make(1)
    entered = asyncio.Event()

    async def request() -> None:
        async with await admission.acquire():
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(request())
    await entered.wait()
    assert admission.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (admission.in_flight, admission.completed_total) == (0, 1)


async def test_an_exception_inside_the_slot_releases_it() -> None:
    admission = make(1)
    with pytest.raises(RuntimeError, match="boom"):
        async with await admission.acquire():
            raise RuntimeError("boom")
    assert admission.in_flight == 0


async def test_releasing_twice_frees_one_slot() -> None:
    admission = make(2)
    slot = await admission.acquire()
    other = await admission.acquire()
    slot.release()
    slot.release()
    async with slot:
        pass
    assert (admission.in_flight, admission.completed_total) == (1, 1)
    other.release()


async def test_queue_wait_is_measured_on_the_injected_clock() -> None:
    clock = ManualClock()
    admission = TenantAdmission("A", 1, queue_max_depth=4, queue_timeout_s=30, clock=clock)
    held = await admission.acquire()
    [waiter] = await queue_up(admission, 1)
    clock.advance(2.5)
    held.release()
    slot = await waiter
    assert held.queue_wait_s == 0.0
    assert slot.queue_wait_s == 2.5
    window = admission.queue_wait.percentiles()
    assert (window.count, window.p99_ms) == (2, 2500.0)
    slot.release()


async def test_closing_turns_queued_and_new_requests_away_but_lets_running_ones_finish() -> None:
    admission = make(1)
    running = await admission.acquire()
    [waiter] = await queue_up(admission, 1)
    admission.close()
    with pytest.raises(AdmissionClosed):
        await waiter
    with pytest.raises(AdmissionClosed):
        await admission.acquire()
    assert not running.released
    idle = asyncio.create_task(admission.wait_idle())
    await asyncio.sleep(0)
    assert not idle.done()
    running.release()
    await idle
    assert admission.rejected_by_reason["shutting_down"] == 2


@pytest.mark.parametrize("seed", range(5))
async def test_random_operations_keep_the_invariants(seed: int) -> None:
    """Acquire, release, resize and cancel at random: FIFO grants, limit held at every grant."""
    rng = random.Random(seed)
    admission = make(2, depth=8)
    arrivals: list[int] = []
    grants: list[int] = []
    held: list[Slot] = []
    waiting: dict[int, asyncio.Task[Slot]] = {}

    async def request(ident: int) -> Slot:
        slot = await admission.acquire()
        # A grant must never push in_flight above the limit that was in force when it was given,
        # and the limit may only have shrunk since: so checking here is conservative for growth.
        grants.append(ident)
        return slot

    def note_grants() -> None:
        for ident, task in list(waiting.items()):
            if task.done():
                del waiting[ident]
                if not task.cancelled() and task.exception() is None:
                    held.append(task.result())

    for ident in range(300):
        action = rng.choice(["acquire", "acquire", "release", "resize", "cancel"])
        if action == "acquire":
            admitted_before = admission.admitted_total
            in_flight_before = admission.in_flight
            task = asyncio.create_task(request(ident))
            await asyncio.sleep(0)
            if not task.done():
                waiting[ident] = task
                arrivals.append(ident)
            elif task.exception() is None:
                # Admitted at once: only possible with nothing queued and room under the limit.
                assert in_flight_before < admission.limit_slots
                assert admission.admitted_total == admitted_before + 1
                held.append(task.result())
        elif action == "release" and held:
            held.pop(rng.randrange(len(held))).release()
        elif action == "resize":
            admission.resize(rng.randint(0, 4))
        elif action == "cancel" and waiting:
            victim = rng.choice(list(waiting))
            waiting[victim].cancel()
            await asyncio.gather(waiting[victim], return_exceptions=True)
        await asyncio.sleep(0)
        note_grants()
        assert admission.in_flight == admission.admitted_total - admission.completed_total
        assert admission.in_flight == len(held) + sum(
            1 for t in waiting.values() if t.done() and not t.cancelled()
        )
        if admission.queued:
            assert admission.in_flight >= admission.limit_slots
    queued_grants = [g for g in grants if g in set(arrivals)]
    granted_arrivals = [a for a in arrivals if a in set(queued_grants)]
    assert queued_grants == granted_arrivals, "queued requests were not admitted in FIFO order"
    admission.resize(100)
    await asyncio.sleep(0)
    note_grants()
    for slot in held:
        slot.release()
    assert (admission.in_flight, admission.queued) == (0, 0)
