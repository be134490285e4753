"""Weighted admission: requests costing several slots, the oversize rule, FIFO with mixed costs,
and pausing, resuming and moving requests that keep their cost."""

from __future__ import annotations

import asyncio
import random

import pytest

from admission_gateway.admission import QueueTimeout, Slot, TenantAdmission
from slotshift.clock import ManualClock
from tests.support import wait_until


def make(
    limit: int, *, depth: int = 16, timeout_s: float = 30.0, clock: ManualClock | None = None
) -> TenantAdmission:
    return TenantAdmission(
        "A",
        limit,
        queue_max_depth=depth,
        queue_timeout_s=timeout_s,
        clock=clock or ManualClock(),
        max_pauses_per_request=2,
    )


async def enqueue(admission: TenantAdmission, cost: int) -> asyncio.Task[Slot]:
    """One waiter of `cost` slots, in the queue when this returns."""
    before = admission.queued_requests
    task = asyncio.create_task(admission.acquire(cost_slots=cost))
    await wait_until(lambda: admission.queued_requests == before + 1, interval_s=0.001)
    return task


async def test_a_request_holds_its_cost_and_release_frees_all_of_it() -> None:
    admission = make(8)
    first = await admission.acquire(cost_slots=3)
    second = await admission.acquire(cost_slots=3)
    assert (admission.in_flight, admission.in_flight_requests) == (6, 2)
    third = await enqueue(admission, 3)
    assert (admission.queued, admission.queued_requests) == (3, 1), "6 + 3 > 8: it waits"
    counts = admission.counts()
    assert (counts.in_flight, counts.queued, counts.in_flight_requests) == (6, 3, 2)
    first.release()
    slot = await third
    assert slot.cost_slots == 3
    assert (admission.in_flight, admission.in_flight_requests, admission.queued) == (6, 2, 0)
    second.release()
    slot.release()
    slot.release()
    assert (admission.in_flight, admission.in_flight_requests) == (0, 0)
    assert (admission.admitted_total, admission.completed_total) == (3, 3)


async def test_a_request_costing_less_than_one_slot_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        await make(4).acquire(cost_slots=0)


async def test_a_request_costing_more_than_the_limit_runs_alone_and_never_waits_forever() -> None:
    admission = make(4)
    small = await admission.acquire(cost_slots=1)
    oversize = await enqueue(admission, 10)
    behind = await enqueue(admission, 1)
    assert admission.queued == 11, "it waits asking for all it costs: the tenant's demand"
    assert not oversize.done(), "it waits while anything else of the tenant runs"
    small.release()
    big = await oversize
    assert (big.cost_slots, big.asked_slots) == (4, 10), "charged the whole limit"
    assert admission.in_flight == 4
    await asyncio.sleep(0)
    assert not behind.done(), "nothing joins it: it holds the whole limit"
    big.release()
    (await behind).release()
    alone = await admission.acquire(cost_slots=10)
    assert alone.cost_slots == 4, "with nothing in flight it is admitted at once"
    alone.release()
    admission.resize(12)
    assert (await admission.acquire(cost_slots=10)).cost_slots == 10, "no longer oversize"


async def test_an_oversize_request_is_not_admitted_under_a_limit_of_zero() -> None:
    admission = make(0, timeout_s=0.05)
    with pytest.raises(QueueTimeout):
        await admission.acquire(cost_slots=3)
    admission.resize(1)
    slot = await admission.acquire(cost_slots=3)
    assert (slot.cost_slots, admission.in_flight) == (1, 1)
    slot.release()


async def test_a_cheap_request_does_not_overtake_a_costly_one_at_the_head() -> None:
    admission = make(4)
    held = await admission.acquire(cost_slots=3)
    costly = await enqueue(admission, 4)
    cheap = await enqueue(admission, 1)
    await asyncio.sleep(0)
    assert not cheap.done(), "1 slot is free, but the costly request came first"
    late = await enqueue(admission, 1)
    held.release()
    costly_slot = await costly
    await asyncio.sleep(0)
    assert not cheap.done() and not late.done()
    costly_slot.release()
    (await cheap).release()
    (await late).release()
    assert (admission.in_flight, admission.queued) == (0, 0)


async def test_a_costly_head_that_leaves_lets_the_cheaper_ones_behind_it_in() -> None:
    admission = make(4)
    held = await admission.acquire(cost_slots=3)
    costly = await enqueue(admission, 4)
    cheap = await enqueue(admission, 1)
    costly.cancel()
    await asyncio.gather(costly, return_exceptions=True)
    slot = await cheap
    assert (admission.in_flight, admission.queued, admission.abandoned_total) == (4, 0, 1)
    slot.release()
    held.release()


async def test_a_costly_head_that_times_out_lets_the_cheaper_ones_behind_it_in() -> None:
    admission = make(4, timeout_s=0.05)
    held = await admission.acquire(cost_slots=3)
    costly = asyncio.create_task(admission.acquire(cost_slots=4))
    await wait_until(lambda: admission.queued_requests == 1, interval_s=0.001)
    # Queued after the head, so it times out later: it is admitted when the head leaves.
    await asyncio.sleep(0.02)
    cheap = await enqueue(admission, 1)
    with pytest.raises(QueueTimeout):
        await costly
    slot = await asyncio.wait_for(cheap, timeout=5)
    assert admission.in_flight == 4
    slot.release()
    held.release()


async def test_growing_and_shrinking_the_limit_count_slots_not_requests() -> None:
    admission = make(6)
    slots = [await admission.acquire(cost_slots=3) for _ in range(2)]
    admission.resize(4)
    waiter = await enqueue(admission, 2)
    slots.pop().release()
    await asyncio.sleep(0)
    assert not waiter.done(), "3 + 2 > 4 under the shrunk limit"
    admission.resize(5)
    slot = await waiter
    assert (admission.in_flight, admission.in_flight_requests) == (5, 2)
    slot.release()
    slots.pop().release()


async def test_the_pause_level_counts_slots_and_pauses_whole_requests_youngest_first() -> None:
    clock = ManualClock()
    admission = make(10, clock=clock)
    slots = []
    for cost in (2, 2, 4):
        clock.advance(1.0)
        slots.append(await admission.acquire(pausable=True, cost_slots=cost))
    admission.set_pause_above(5)
    assert [s.pause_requested for s in slots] == [False, False, True], (
        "pausing the youngest (4 slots) leaves 4 <= 5 running"
    )
    admission.set_pause_above(2)
    assert [s.pause_requested for s in slots] == [False, True, True], (
        "the next youngest goes, leaving 2 slots running"
    )
    for slot in slots:
        slot.release()


async def test_a_paused_request_waits_with_its_cost_and_resumes_with_it() -> None:
    clock = ManualClock()
    admission = make(6, clock=clock)
    clock.advance(1.0)
    old = await admission.acquire(cost_slots=2)
    clock.advance(1.0)
    young = await admission.acquire(pausable=True, cost_slots=4)
    admission.resize(2)
    admission.set_pause_above(2)
    assert young.pause_requested
    resumed = asyncio.create_task(admission.resume(young))
    await wait_until(lambda: admission.paused_requests == 1, interval_s=0.001)
    assert (admission.in_flight, admission.queued, admission.paused) == (2, 4, 4)
    admission.set_pause_above(None)
    admission.resize(6)
    slot = await resumed
    assert (slot.cost_slots, slot.asked_slots, slot.pauses) == (4, 4, 1)
    assert (admission.in_flight, admission.queued, admission.paused) == (6, 0, 0)
    old.release()
    slot.release()
    await asyncio.wait_for(admission.wait_idle(), timeout=5)


async def test_a_request_moved_from_a_lost_pool_keeps_its_cost() -> None:
    lost_pool, here = make(8), make(8)
    running = await lost_pool.acquire(pausable=True, cost_slots=5)
    blocker = await here.acquire(cost_slots=4)
    moved = asyncio.create_task(here.take_over(running))
    await wait_until(lambda: here.paused_requests == 1, interval_s=0.001)
    assert (here.queued, here.paused, lost_pool.in_flight) == (5, 5, 0)
    blocker.release()
    slot = await moved
    assert (slot.cost_slots, here.in_flight, here.in_flight_requests) == (5, 5, 1)
    slot.release()


@pytest.mark.parametrize("seed", range(8))
async def test_random_weighted_operations_keep_the_invariants(seed: int) -> None:
    """Acquire at random costs, release, resize and cancel: every grant within the limit or the
    lone oversize request, slots and requests in flight balance, FIFO."""
    rng = random.Random(seed)
    admission = make(6, depth=8)
    arrivals: list[int] = []
    grants: list[int] = []
    held: dict[Slot, int] = {}
    waiting: dict[int, asyncio.Task[Slot]] = {}
    costs: dict[int, int] = {}

    async def request(ident: int) -> Slot:
        slot = await admission.acquire(cost_slots=costs[ident])
        grants.append(ident)
        # At this grant: within the limit, an oversize request too (charged the limit).
        assert admission.in_flight <= admission.limit_slots
        return slot

    def note_grants() -> None:
        for ident, task in list(waiting.items()):
            if task.done():
                del waiting[ident]
                if not task.cancelled() and task.exception() is None:
                    slot = task.result()
                    assert slot.asked_slots == costs[ident]
                    assert slot.cost_slots == costs[ident] or len(held) == 0
                    held[slot] = slot.cost_slots

    for ident in range(400):
        action = rng.choice(["acquire", "acquire", "release", "resize", "cancel"])
        if action == "acquire":
            costs[ident] = rng.choice([1, 1, 2, 3, 5, 9])
            task = asyncio.create_task(request(ident))
            await asyncio.sleep(0)
            if not task.done():
                waiting[ident] = task
                arrivals.append(ident)
            elif task.exception() is None:
                held[task.result()] = task.result().cost_slots
        elif action == "release" and held:
            slot = rng.choice(list(held))
            del held[slot]
            slot.release()
        elif action == "resize":
            admission.resize(rng.randint(0, 10))
        elif action == "cancel" and waiting:
            victim = rng.choice(list(waiting))
            waiting[victim].cancel()
            await asyncio.gather(waiting[victim], return_exceptions=True)
        await asyncio.sleep(0)
        note_grants()
        assert admission.in_flight == sum(held.values())
        assert admission.in_flight_requests == len(held)
        assert admission.queued == sum(costs[i] for i, t in waiting.items() if not t.done())
    queued_grants = [g for g in grants if g in set(arrivals)]
    granted_arrivals = [a for a in arrivals if a in set(queued_grants)]
    assert queued_grants == granted_arrivals, "queued requests were not admitted in FIFO order"
    admission.resize(100)
    await asyncio.sleep(0)
    note_grants()
    for slot in held:
        slot.release()
    assert (admission.in_flight, admission.in_flight_requests, admission.queued) == (0, 0, 0)


async def test_a_request_resumed_under_a_smaller_limit_is_charged_it_and_asks_its_cost_again() -> (
    None
):
    clock = ManualClock()
    admission = make(6, clock=clock)
    running = await admission.acquire(pausable=True, cost_slots=5)
    admission.resize(2)
    admission.set_pause_above(0)
    resumed = asyncio.create_task(admission.resume(running))
    slot = await resumed
    assert (slot.cost_slots, slot.asked_slots, admission.in_flight) == (2, 5, 2), (
        "alone and oversize under the limit of 2: charged 2"
    )
    admission.set_pause_above(None)
    slot.release()
