"""Per-tenant admission: a tenant's running requests hold at most `limit_slots`; the rest wait.

This is the lever slotshift turns: the control plane resizes each tenant's limit, and the gateway
lets only that many slots of the tenant's requests into the engine. A request holds one slot, or,
in a pool that weighs requests (pools[].request_cost, admission_gateway/request_cost.py), the
slots its expected size costs (`acquire(cost_slots=...)`); every count of slots here (in_flight,
queued, paused, the limit and the pause level) is in those slots, and the counts of requests are
kept beside them (`in_flight_requests`, `queued_requests`). The rules, after Kubernetes API
Priority and Fairness's fair queuing (whose work estimation weighs requests in seats alike):

- `in_flight <= limit_slots` holds at every admission. A request that costs more than the whole
  limit could never fit: it is admitted when the tenant has nothing else in flight here (and
  the limit is not 0), so that it never waits forever, and is charged the whole limit (its
  `cost_slots`; what it asked for stays its `asked_slots`), so that the tenant's slots, and the
  pool's budget, still hold; it waits its turn like any other. While it waits it counts as
  queued by what it asked for: that is the tenant's demand. Requests beyond the limit wait in a
  bounded FIFO queue (its depth counts requests); a full queue rejects at once (QueueFull), a
  request that waits too long is rejected (QueueTimeout).
- Strict FIFO: a newly arriving request never overtakes a queued one, even when a slot is free at
  the moment it arrives but a queued request has been granted it and has not run yet; nor does
  a cheap request overtake a costly one waiting at the head for enough slots to free.
- Growing the limit admits queued requests in FIFO order up to the new limit. Shrinking it never
  cancels a running request: admission just stops until in_flight has fallen enough.
- A pausable request (a preemptible tenant's, docs/preemption.md) may be asked to pause when a
  pause level is set (`set_pause_above`), youngest by original admission first; it gives its slots
  back through `resume`, waits ahead of every request never paused (exempt from the queue's
  timeout, depth and `close`) and continues on new slots (as many as it cost) with its original
  admission time.
- A pausable request whose engine was lost at another pool (a replica that went away) may move
  here (`take_over`): it waits as a paused request does and continues here, where it is
  counted as admitted; its slot at the lost pool is released as it moves.
- A slot is released exactly once, however its request ends (normal end, error, cancellation
  while queued or while running): `Slot` is an async context manager and release is idempotent.

Pure asyncio and stdlib (import-linter forbids web and RPC frameworks here). Queue waits are
measured with the injected Clock; the queue timeout itself is an event-loop timer, because only the
loop can wake a waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar

from admission_gateway.latency_window import LatencyWindow
from slotshift.clock import Clock


class AdmissionRejected(Exception):
    """A request was not admitted; `reason` is the label it is counted under."""

    reason: ClassVar[str] = "rejected"


class QueueFull(AdmissionRejected):
    """The tenant's queue already holds queue_max_depth requests."""

    reason: ClassVar[str] = "queue_full"


class QueueTimeout(AdmissionRejected):
    """The request waited queue_timeout_s without getting a slot."""

    reason: ClassVar[str] = "queue_timeout"


class AdmissionClosed(AdmissionRejected):
    """The gateway is shutting down and admits nothing more."""

    reason: ClassVar[str] = "shutting_down"


REJECTION_REASONS: tuple[str, ...] = (QueueFull.reason, QueueTimeout.reason, AdmissionClosed.reason)
"""Every reason a rejection is counted under."""


@dataclass(frozen=True, slots=True)
class AdmissionCounts:
    """One tenant's admission counters and gauges at one moment: the admission's part of the
    tenant's demand (slotshift.demand.TenantDemand, which the gateway builds from it)."""

    tenant: str
    limit_slots: int
    in_flight: int
    """Slots held by admitted requests (one per request unless the pool weighs requests)."""
    queued: int
    """Slots the waiting requests will hold once admitted."""
    admitted_total: int
    completed_total: int
    rejected_total: int
    paused: int = 0
    """Of `queued`, the slots of paused requests waiting to resume."""
    pauses_total: int = 0
    """Times a running request of the tenant was paused here."""
    in_flight_requests: int = 0
    """Admitted requests that hold their slots (the engine's max_num_seqs caps these)."""
    queued_requests: int = 0
    """Requests waiting, paused ones included."""


class Slot:
    """The right to run one request, worth `cost_slots` of the tenant's limit; release it
    exactly once (leaving `async with` does).

    Releasing twice is harmless: only the first release frees the slot.

    A slot of a pausable request may be asked to pause (`pause_requested`): its holder then stops
    the request's work in the engine, releases the slot once the work has left the engine, and
    waits with `TenantAdmission.resume` for a new one.
    """

    __slots__ = (
        "_admission",
        "_can_pause",
        "_on_pause",
        "_released",
        "_resuming",
        "admitted_at_s",
        "asked_slots",
        "cost_slots",
        "pausable",
        "pause_requested",
        "pauses",
        "queue_wait_s",
    )

    def __init__(
        self,
        admission: TenantAdmission,
        queue_wait_s: float,
        *,
        admitted_at_s: float,
        pauses: int = 0,
        pausable: bool = False,
        cost_slots: int = 1,
        asked_slots: int | None = None,
    ) -> None:
        self._admission = admission
        self._released = False
        self._on_pause: Callable[[], None] | None = None
        self._can_pause: Callable[[], bool] | None = None
        self._resuming = False
        self.queue_wait_s = queue_wait_s
        """Seconds the request waited in the queue before it was admitted."""
        self.admitted_at_s = admitted_at_s
        """When the request was first admitted (monotonic s): a resumed request keeps its
        original time, so that the youngest work is paused first."""
        self.pauses = pauses
        """Times the request was paused before this slot."""
        self.pausable = pausable
        """Whether the request may be paused (a preemptible tenant's resumable request)."""
        self.pause_requested = False
        """Set once the admission has chosen this request to pause."""
        self.cost_slots = cost_slots
        """Slots of the limit the request holds: what it asked for, or the whole limit for a
        request that asked for more (admitted alone)."""
        self.asked_slots = cost_slots if asked_slots is None else asked_slots
        """Slots the request costs by its size; a resumed or moved request asks for them again."""

    @property
    def released(self) -> bool:
        return self._released

    def on_pause(
        self, callback: Callable[[], None] | None, *, can_pause: Callable[[], bool] | None = None
    ) -> None:
        """Call `callback` (at once if already asked) when the request is to pause; it must not
        block: it typically closes the request's upstream connection. `can_pause` says whether
        pausing now would lose nothing; while it says no, the request is not chosen."""
        self._on_pause = callback
        self._can_pause = can_pause
        if callback is not None and self.pause_requested:
            callback()

    @property
    def eligible(self) -> bool:
        """Whether the request may be chosen to pause now."""
        if not self.pausable or self.pause_requested or self._released:
            return False
        return self._can_pause is None or self._can_pause()

    def release(self) -> None:
        """Give the slot back (all `cost_slots` of it); it goes to the longest-waiting queued
        request, if that fits."""
        if self._released:
            return
        self._released = True
        self._admission._on_release(self)

    def _request_pause(self) -> None:
        self.pause_requested = True
        if self._on_pause is not None:
            self._on_pause()

    async def __aenter__(self) -> Slot:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


@dataclass(slots=True, eq=False)
class _Waiter:
    future: asyncio.Future[Slot]
    enqueued_at: float
    cost_slots: int = 1
    timer: asyncio.TimerHandle | None = None
    pausable: bool = False
    paused: Slot | None = None
    """The released slot of a paused request waiting to resume (it goes ahead of the rest)."""
    moved: bool = False
    """`paused` is the released slot of another pool's admission whose engine was lost: the
    request was never admitted here."""


class TenantAdmission:
    """Admission for one tenant at one gateway, with a limit that can change at any time."""

    def __init__(
        self,
        tenant: str,
        limit_slots: int,
        *,
        queue_max_depth: int,
        queue_timeout_s: float,
        clock: Clock,
        queue_wait_window: LatencyWindow | None = None,
        on_queue_started: Callable[[], None] | None = None,
        max_pauses_per_request: int = 0,
    ) -> None:
        if limit_slots < 0:
            raise ValueError(f"limit_slots must not be negative, got {limit_slots}")
        if queue_max_depth < 0:
            raise ValueError(f"queue_max_depth must not be negative, got {queue_max_depth}")
        if queue_timeout_s <= 0:
            raise ValueError(f"queue_timeout_s must be positive, got {queue_timeout_s}")
        self.tenant = tenant
        self._on_queue_started = on_queue_started
        """Called when a request has to wait while none was waiting, and when a paused request
        has given its slot back: the gateway tells the control plane at once instead of at its
        next periodic report."""
        self._max_pauses = max_pauses_per_request
        self._running: dict[Slot, None] = {}
        """Unreleased slots in admission order (a dict as an ordered set)."""
        self._pause_above: int | None = None
        self._pausing = 0
        """Slots (by cost) asked to pause and not yet released."""
        self._paused_waiting = 0
        """Paused (or moved-in) requests waiting to resume."""
        self._paused_slots = 0
        """Their cost."""
        self._pauses_total = 0
        self._limit = limit_slots
        self._queue_max_depth = queue_max_depth
        self._queue_timeout_s = queue_timeout_s
        self._clock = clock
        self.queue_wait = (
            queue_wait_window if queue_wait_window is not None else LatencyWindow(clock)
        )
        """Queue waits of recently admitted requests (0 for those admitted at once)."""
        self._queue: deque[_Waiter] = deque()
        self._queued_slots = 0
        """The cost of the requests in `_queue`."""
        self._in_flight = 0
        """Slots held, by cost."""
        self._in_flight_requests = 0
        self._admitted_total = 0
        self._completed_total = 0
        self._abandoned_total = 0
        self._rejected: dict[str, int] = dict.fromkeys(REJECTION_REASONS, 0)
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def limit_slots(self) -> int:
        """Most slots the tenant's running requests hold at once from now on (but for a lone
        request costing more, see the module's rules)."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """Slots held by admitted requests whose slot has not been released yet (one per
        request unless the pool weighs requests)."""
        return self._in_flight

    @property
    def in_flight_requests(self) -> int:
        """Admitted requests whose slot has not been released yet."""
        return self._in_flight_requests

    @property
    def queued(self) -> int:
        """Slots the requests waiting for one will hold (one per request unless the pool weighs
        requests)."""
        return self._queued_slots

    @property
    def queued_requests(self) -> int:
        """Requests waiting for a slot, paused ones included."""
        return len(self._queue)

    @property
    def paused(self) -> int:
        """Slots of the paused requests waiting to resume (counted in `queued` too)."""
        return self._paused_slots

    @property
    def paused_requests(self) -> int:
        """Paused requests waiting to resume (counted in `queued_requests` too)."""
        return self._paused_waiting

    @property
    def pauses_total(self) -> int:
        return self._pauses_total

    @property
    def pause_above_slots(self) -> int | None:
        """The pause level in force (see set_pause_above); None when nothing is to pause."""
        return self._pause_above

    @property
    def admitted_total(self) -> int:
        return self._admitted_total

    @property
    def completed_total(self) -> int:
        """Admitted requests that have released their slot, whatever their outcome."""
        return self._completed_total

    @property
    def abandoned_total(self) -> int:
        """Queued requests whose caller gave up (was cancelled) before being admitted."""
        return self._abandoned_total

    @property
    def rejected_total(self) -> int:
        return sum(self._rejected.values())

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        """Rejections per reason (every reason of REJECTION_REASONS is present)."""
        return dict(self._rejected)

    @property
    def closed(self) -> bool:
        return self._closed

    def counts(self) -> AdmissionCounts:
        """The counters and gauges as one consistent snapshot."""
        return AdmissionCounts(
            tenant=self.tenant,
            limit_slots=self._limit,
            in_flight=self._in_flight,
            queued=self._queued_slots,
            admitted_total=self._admitted_total,
            completed_total=self._completed_total,
            rejected_total=self.rejected_total,
            paused=self._paused_slots,
            pauses_total=self._pauses_total,
            in_flight_requests=self._in_flight_requests,
            queued_requests=len(self._queue),
        )

    async def acquire(self, *, pausable: bool = False, cost_slots: int = 1) -> Slot:
        """Wait for `cost_slots` slots (at least 1), first come first served.

        Raises QueueFull when the queue is full, QueueTimeout after queue_timeout_s without a
        slot, AdmissionClosed once `close` has been called. Cancelling the caller while it waits
        leaves no trace in the queue and holds no slot. A request costing more than the limit
        is admitted once nothing else of the tenant is in flight (see the module's rules).
        """
        if cost_slots < 1:
            raise ValueError(f"a request costs at least one slot, got {cost_slots}")
        if self._closed:
            raise self._rejection(
                AdmissionClosed(f"tenant {self.tenant}: not admitting, shutting down")
            )
        if not self._queue and self._fits(cost_slots):
            return self._grant(self._clock.monotonic(), pausable=pausable, cost_slots=cost_slots)
        waiting = len(self._queue) - self._paused_waiting
        if waiting >= self._queue_max_depth:
            raise self._rejection(
                QueueFull(f"tenant {self.tenant}: {waiting} requests already queued")
            )
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            loop.create_future(), self._clock.monotonic(), cost_slots, pausable=pausable
        )
        waiter.timer = loop.call_later(self._queue_timeout_s, self._expire, waiter)
        self._queue.append(waiter)
        self._queued_slots += cost_slots
        if len(self._queue) == 1 and self._on_queue_started is not None:
            self._on_queue_started()
        return await self._wait(waiter)

    async def resume(self, paused: Slot) -> Slot:
        """Give back the slot of a request that was asked to pause, and wait for a new one.

        Call it once the request's work has left the engine. The slot is released at once; the
        request then waits ahead of every request that was never paused (behind paused ones
        admitted before it), exempt from queue_timeout_s, queue_max_depth and `close`: a paused
        request is never failed. The new slot keeps the original admission time and counts the
        pause. Cancelling the caller while it waits leaves no trace, as with acquire.
        """
        if paused.released or not paused.pause_requested or paused._admission is not self:
            raise ValueError("only a held slot of this tenant that was asked to pause can resume")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            loop.create_future(), self._clock.monotonic(), paused.asked_slots, pausable=True
        )
        waiter.paused = paused
        self._enqueue_paused(waiter)
        # Queued before the release, so that the freed slot cannot go to anyone behind it and
        # the tenant never looks idle in between.
        paused._resuming = True
        paused.release()
        return await self._wait(waiter)

    async def take_over(self, lost: Slot) -> Slot:
        """Continue here a pausable request admitted at another pool whose engine was lost.

        Call it once the request's work is no longer in the lost engine. `lost` (its slot
        there) is released at once; the request then waits as a paused one does (ahead of every
        request never paused, behind paused ones admitted before it, exempt from
        queue_timeout_s, queue_max_depth and `close`), and gets a pausable slot that keeps its
        original admission time and pause count. Here it counts as admitted (new work for this
        pool) and, while it waits, as paused; its wait is no queue wait of new work. Cancelling
        the caller while it waits leaves no trace, and counts it as abandoned. Raises
        ValueError unless `lost` is a held, pausable slot of another admission.
        """
        if lost.released or not lost.pausable or lost._admission is self:
            raise ValueError("only a held pausable slot of another admission can move here")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            loop.create_future(), self._clock.monotonic(), lost.asked_slots, pausable=True
        )
        waiter.paused = lost
        waiter.moved = True
        self._enqueue_paused(waiter)
        self._idle.clear()
        lost.release()
        self._admit_waiting()
        if not waiter.future.done() and self._on_queue_started is not None:
            # It waits for a slot here: the control plane hears of the demand at once.
            self._on_queue_started()
        return await self._wait(waiter)

    def _enqueue_paused(self, waiter: _Waiter) -> None:
        assert waiter.paused is not None
        self._queue.insert(self._resume_position(waiter.paused), waiter)
        self._queued_slots += waiter.cost_slots
        self._paused_waiting += 1
        self._paused_slots += waiter.cost_slots

    def _unpaused(self, waiter: _Waiter) -> None:
        """`waiter`, a paused one, waits no more (granted, or its caller went away)."""
        self._paused_waiting -= 1
        self._paused_slots -= waiter.cost_slots

    def _fits(self, cost_slots: int) -> bool:
        """Whether a request costing `cost_slots` may be admitted now (the queue aside)."""
        if self._in_flight + cost_slots <= self._limit:
            return True
        # Oversize: more than the whole limit, it could never fit; alone it may run (charged
        # the whole limit).
        return cost_slots > self._limit > 0 and self._in_flight == 0

    def _resume_position(self, paused: Slot) -> int:
        """Where a paused request waits: behind the paused ones admitted before it, ahead of
        the rest."""
        for index, queued in enumerate(self._queue):
            if queued.paused is None or queued.paused.admitted_at_s > paused.admitted_at_s:
                return index
        return len(self._queue)

    async def _wait(self, waiter: _Waiter) -> Slot:
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise

    def set_pause_above(self, level: int | None) -> None:
        """Pause running requests, youngest by original admission first, until the slots of
        those left running are at most `level` (counting those already pausing as gone); None
        pauses nothing more. Only pausable requests paused fewer than max_pauses_per_request
        times are chosen, so fewer may pause than asked; whole requests pause, so a costly one
        may free more than asked. Requests already asked to pause are not called back."""
        if level is not None and level < 0:
            raise ValueError(f"a pause level must not be negative, got {level}")
        self._pause_above = level
        self._pause_excess()

    def resize(self, limit_slots: int) -> None:
        """Enforce a new limit. Growing admits queued requests in order; shrinking cancels nothing."""
        if limit_slots < 0:
            raise ValueError(f"limit_slots must not be negative, got {limit_slots}")
        self._limit = limit_slots
        self._admit_waiting()

    def close(self) -> None:
        """Admit nothing more: queued requests and later arrivals get AdmissionClosed.

        Running requests keep their slots; `wait_idle` tells when they have all finished.
        """
        self._closed = True
        kept: deque[_Waiter] = deque()
        while self._queue:
            waiter = self._queue.popleft()
            if waiter.paused is not None:
                kept.append(waiter)
                continue
            self._cancel_timer(waiter)
            if not waiter.future.done():
                waiter.future.set_exception(
                    self._rejection(AdmissionClosed(f"tenant {self.tenant}: shutting down"))
                )
        self._queue = kept
        self._queued_slots = sum(waiter.cost_slots for waiter in kept)

    async def wait_idle(self) -> None:
        """Return once no request holds a slot and no paused request waits to resume."""
        await self._idle.wait()

    def _grant(
        self,
        enqueued_at: float,
        *,
        pausable: bool = False,
        paused: Slot | None = None,
        moved: bool = False,
        cost_slots: int = 1,
    ) -> Slot:
        now = self._clock.monotonic()
        wait_s = max(0.0, now - enqueued_at)
        asked_slots = cost_slots
        # An oversize request (admitted alone, see _fits) is charged the whole limit.
        cost_slots = min(cost_slots, self._limit)
        self._in_flight += cost_slots
        self._in_flight_requests += 1
        self._idle.clear()
        if paused is not None and moved:
            # New work for this pool (counted admitted, so that its release balances), but no
            # new arrival: its wait says nothing about this pool's queue.
            self._admitted_total += 1
            slot = Slot(
                self,
                paused.queue_wait_s,
                admitted_at_s=paused.admitted_at_s,
                pauses=paused.pauses,
                pausable=True,
                cost_slots=cost_slots,
                asked_slots=asked_slots,
            )
        elif paused is None:
            self._admitted_total += 1
            self.queue_wait.observe(wait_s)
            slot = Slot(
                self,
                wait_s,
                admitted_at_s=now,
                pausable=pausable,
                cost_slots=cost_slots,
                asked_slots=asked_slots,
            )
        else:
            # A resumed request was admitted once already: it is not counted again, and its
            # wait is not a queue wait of new work.
            slot = Slot(
                self,
                paused.queue_wait_s,
                admitted_at_s=paused.admitted_at_s,
                pauses=paused.pauses + 1,
                pausable=True,
                cost_slots=cost_slots,
                asked_slots=asked_slots,
            )
        self._running[slot] = None
        return slot

    def _on_release(self, slot: Slot) -> None:
        del self._running[slot]
        self._in_flight -= slot.cost_slots
        self._in_flight_requests -= 1
        if slot.pause_requested:
            self._pausing -= slot.cost_slots
        if slot._resuming:
            self._pauses_total += 1
            if self._on_queue_started is not None:
                self._on_queue_started()
        else:
            # Finished (even if it was asked to pause just before it did).
            self._completed_total += 1
        self._update_idle()
        self._admit_waiting()

    def _update_idle(self) -> None:
        if self._in_flight == 0 and self._paused_waiting == 0:
            self._idle.set()
        else:
            self._idle.clear()

    def _pause_excess(self) -> None:
        level = self._pause_above
        if level is None:
            return
        excess = self._in_flight - self._pausing - level
        if excess <= 0:
            return
        eligible = [
            slot for slot in self._running if slot.pauses < self._max_pauses and slot.eligible
        ]
        eligible.sort(key=lambda slot: slot.admitted_at_s, reverse=True)
        for slot in eligible:
            if excess <= 0:
                break
            # Whole requests only: a costly one may free more than the excess.
            excess -= slot.cost_slots
            self._pausing += slot.cost_slots
            slot._request_pause()

    def _admit_waiting(self) -> None:
        # The slot is counted as in flight the moment it is handed over, not when the waiter runs,
        # so nothing arriving in between can take it (no barging).
        # The head waits until it fits, and everything behind it waits too (strict FIFO).
        while self._queue:
            head = self._queue[0]
            if not head.future.done() and not self._fits(head.cost_slots):
                return
            waiter = self._dequeue_head()
            self._cancel_timer(waiter)
            if waiter.future.done():
                # Its caller was cancelled and has not cleaned up yet; `_abandon` will.
                continue
            if waiter.paused is not None:
                self._unpaused(waiter)
            waiter.future.set_result(
                self._grant(
                    waiter.enqueued_at,
                    pausable=waiter.pausable,
                    paused=waiter.paused,
                    moved=waiter.moved,
                    cost_slots=waiter.cost_slots,
                )
            )

    def _dequeue_head(self) -> _Waiter:
        waiter = self._queue.popleft()
        self._queued_slots -= waiter.cost_slots
        return waiter

    def _expire(self, waiter: _Waiter) -> None:
        waiter.timer = None
        if waiter.future.done():
            return
        self._remove(waiter)
        waiter.future.set_exception(
            self._rejection(
                QueueTimeout(f"tenant {self.tenant}: no slot within {self._queue_timeout_s:g} s")
            )
        )

    def _abandon(self, waiter: _Waiter) -> None:
        """Clean up after a caller cancelled while it waited (or just after it was admitted)."""
        self._cancel_timer(waiter)
        future = waiter.future
        if not future.done():
            future.cancel()
        if future.cancelled():
            self._remove(waiter)
            if waiter.paused is not None:
                # Off the queue either way (_admit_waiting may have dropped it already). It was
                # admitted once: it ends here, as a completion, not as an abandoned arrival;
                # unless it was admitted at another pool only, where its completion counted.
                self._unpaused(waiter)
                if waiter.moved:
                    self._abandoned_total += 1
                else:
                    self._completed_total += 1
                self._update_idle()
            else:
                self._abandoned_total += 1
        elif future.exception() is None:
            # Granted a slot, then cancelled before it could run: hand the slot on.
            future.result().release()
        # Otherwise it timed out or was closed out: already removed and counted.

    def _remove(self, waiter: _Waiter) -> None:
        # It may already be off the queue: _admit_waiting drops waiters whose caller has gone.
        with contextlib.suppress(ValueError):
            self._queue.remove(waiter)
            self._queued_slots -= waiter.cost_slots
        # A costly head that left may have held back cheaper requests behind it.
        self._admit_waiting()

    def _rejection(self, error: AdmissionRejected) -> AdmissionRejected:
        self._rejected[error.reason] += 1
        return error

    @staticmethod
    def _cancel_timer(waiter: _Waiter) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
