"""The async driver: runs the pure EngineCore's steps in real time and streams their tokens.

The loop schedules a step, sleeps for the step's modelled duration (that sleep IS the emulated
GPU's work), completes it, and hands each request's tokens to its RequestStream. With nothing to
do it waits on an event that submit() sets, so an idle engine costs nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from engine_sim.engine_core import (
    EngineCore,
    FinishedRequest,
    RequestSpec,
    StepOutcome,
    TokenEmitted,
)
from engine_sim.gpu_model import BusyTracker, GpuMemoryModel
from engine_sim.metrics import EngineMetrics, LiveReadings
from slotshift.clock import Clock
from slotshift.config import EngineSimConfig

MAX_CATCH_UP_S = 0.05
"""Most a late step loop makes up for by starting the next step early (see AsyncEngine.run)."""


class RequestStream:
    """One request's output as it is produced: its tokens, then how it finished."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.finished: FinishedRequest | None = None
        """Set once the request has left the engine."""
        self._events: asyncio.Queue[TokenEmitted | FinishedRequest] = asyncio.Queue()

    def push(self, event: TokenEmitted | FinishedRequest) -> None:
        self._events.put_nowait(event)

    async def tokens(self) -> AsyncIterator[TokenEmitted]:
        """Each token as its step completes; ends when the request finishes (see .finished)."""
        while True:
            event = await self._events.get()
            if isinstance(event, FinishedRequest):
                self.finished = event
                return
            yield event


class AsyncEngine:
    """An EngineCore driven in real time, with its emulated GPU and its metrics."""

    def __init__(self, config: EngineSimConfig, clock: Clock) -> None:
        self._clock = clock
        self.core = EngineCore(config)
        self._busy = BusyTracker(config.gpu_utilization_window_s)
        self._memory = GpuMemoryModel(config)
        self.metrics = EngineMetrics(
            self.core.profile.model_name,
            LiveReadings(
                num_running=lambda: self.core.num_running,
                num_waiting=lambda: self.core.num_waiting,
                kv_cache_usage=lambda: self.core.kv_cache_usage,
                gpu_utilization_percent=lambda: 100.0 * self.gpu_utilization(),
                gpu_memory_used_bytes=lambda: self._memory.used_bytes(self.core.used_blocks),
                gpu_memory_total_bytes=lambda: self._memory.total_bytes,
                peak_in_engine=lambda: self.core.peak_in_engine,
            ),
        )
        self._streams: dict[str, RequestStream] = {}
        self._work_arrived = asyncio.Event()

    def gpu_utilization(self) -> float:
        """Busy fraction of the recent window, 0 to 1."""
        return self._busy.utilization(self._clock.monotonic())

    def submit(self, spec: RequestSpec) -> RequestStream:
        """Queue a request; its tokens arrive on the returned stream."""
        self.core.add_request(spec, self._clock.monotonic())
        stream = RequestStream(spec.request_id)
        self._streams[spec.request_id] = stream
        self._work_arrived.set()
        return stream

    def abort(self, request_id: str) -> None:
        """End a request now (its client went away); nothing happens if it already finished."""
        finished = self.core.abort(request_id, self._clock.monotonic())
        if finished is not None:
            # Not in the request metrics: vLLM 0.32 counts an aborted request in none of them
            # (vllm:request_success_total{finished_reason="abort"} stays 0, nor its latencies;
            # vllm-project/vllm#55634), only in the token counters its steps already fed. The
            # emulator's own slotshift_ counter counts it.
            self.metrics.record_abort()
            self._deliver_finished(finished)

    def abort_all(self) -> None:
        """Abort every request still in the engine (shutdown)."""
        for request_id in list(self._streams):
            self.abort(request_id)

    async def run(self) -> None:
        """The step loop; runs until cancelled."""
        previous_end_s: float | None = None
        while True:
            if not self.core.has_work:
                previous_end_s = None
                self._work_arrived.clear()
                await self._work_arrived.wait()
                continue
            now_s = self._clock.monotonic()
            # Busy steps run back to back on the modelled timeline: the next starts when the
            # previous was due to end. Otherwise the event loop's own latency (timer rounding,
            # other handlers) would stretch every step and the emulator would fall short of the
            # step-time model's throughput. A loop stalled for long does not catch up in a burst.
            started_s = now_s
            if previous_end_s is not None and now_s - previous_end_s < MAX_CATCH_UP_S:
                started_s = previous_end_s
            step = self.core.schedule(started_s)
            self.metrics.record_schedule(step)
            if step.is_empty:
                # Only after preempting the whole batch; the next schedule admits again.
                self.core.complete(step, now_s)
                await asyncio.sleep(0)
                continue
            end_s = started_s + step.duration_s
            self._busy.begin(started_s)
            try:
                await asyncio.sleep(max(0.0, end_s - self._clock.monotonic()))
            finally:
                self._busy.end(end_s)
            previous_end_s = end_s
            self._deliver(self.core.complete(step, self._clock.monotonic()))

    def _deliver(self, outcome: StepOutcome) -> None:
        self.metrics.record_step(outcome)
        for token in outcome.tokens:
            self._streams[token.request_id].push(token)
        for finished in outcome.finished:
            self._deliver_finished(finished)

    def _deliver_finished(self, finished: FinishedRequest) -> None:
        stream = self._streams.pop(finished.request_id)
        stream.push(finished)
