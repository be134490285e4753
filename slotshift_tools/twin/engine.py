"""The emulator's EngineCore driven as a process of the virtual loop.

Like engine_sim's AsyncEngine, the process schedules a step, lets its modelled duration pass and
completes it, back to back while there is work. Between events it jumps: when the loop says
nothing can happen before its next timer (VirtualEventLoop.next_event_s), the decode-only steps
that end before then run at once (EngineCore.advance_decodes) and their tokens are delivered at
the end of the last one, when nothing can have looked in between.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Protocol

from engine_sim.engine_core import EngineCore, FinishedRequest, RequestSpec, StepOutcome
from engine_sim.gpu_model import BusyTracker
from slotshift.config import EngineSimConfig
from slotshift_tools.twin.virtual_loop import VirtualEventLoop


class TokenListener(Protocol):
    """Who reads one request's output (the twin's gateway): told of tokens as steps end."""

    def tokens(self, times_s: Sequence[float], gaps_s: Sequence[float]) -> None:
        """Tokens sampled at `times_s`; `gaps_s` are the gaps between consecutive times (one
        fewer). Called at the last time; must not block."""

    def token(self, time_s: float) -> None:
        """One token sampled at `time_s` (a step's), now; what tokens((time_s,), ()) does."""

    def finished(self, request: FinishedRequest) -> None:
        """The request left the engine (done or aborted); called at once."""


class TwinEngine:
    """One emulated engine on the virtual loop; `run` is its process."""

    def __init__(self, config: EngineSimConfig, loop: VirtualEventLoop, *, closed_form: bool):
        self.core = EngineCore(config)
        self._loop = loop
        self._closed_form = closed_form
        self._busy = BusyTracker(config.gpu_utilization_window_s)
        self._listeners: dict[str, TokenListener] = {}
        self._work = asyncio.Event()
        self.generation_tokens_total = 0
        """Output tokens generated since start (vllm:generation_tokens_total)."""
        self.decode_runs = 0
        self.jumped_steps = 0

    def gpu_utilization_pct(self) -> float:
        """The emulator's busy fraction of its recent window, in percent."""
        return 100.0 * self._busy.utilization(self._loop.time())

    def submit(self, spec: RequestSpec, listener: TokenListener) -> None:
        """Queue a request now; its tokens go to `listener`."""
        self.core.add_request(spec, self._loop.time())
        self._listeners[spec.request_id] = listener
        self._work.set()

    def abort(self, request_id: str) -> None:
        """End a request now (its gateway closed the connection); nothing if it has ended."""
        finished = self.core.abort(request_id, self._loop.time())
        if finished is not None:
            self._listeners.pop(request_id).finished(finished)

    async def run(self) -> None:
        """The step loop, until cancelled."""
        core = self.core
        while True:
            if not core.has_work:
                self._work.clear()
                await self._work.wait()
                continue
            # Whatever else is due now runs first (an arrival at this instant joins this step),
            # in both modes, so that jumping and stepping see the same order; the other engines
            # of a fleet wait the same way, not for one another.
            await self._loop.settled()
            started_s = self._loop.time()
            if self._closed_form:
                run = core.advance_decodes(started_s, self._loop.next_event_s())
                if run is not None:
                    self.decode_runs += 1
                    self.jumped_steps += run.steps
                    await self._busy_until(started_s, run.ends_s[-1])
                    self._deliver_run(run.request_ids, run.ends_s, run.finished)
                    continue
            step = core.schedule(started_s)
            if step.is_empty:
                core.complete(step, started_s)
                await asyncio.sleep(0)
                continue
            await self._busy_until(started_s, started_s + step.duration_s)
            self._deliver(core.complete(step, self._loop.time()))

    async def _busy_until(self, started_s: float, end_s: float) -> None:
        self._busy.begin(started_s)
        try:
            await asyncio.sleep(max(0.0, end_s - self._loop.time()))
        finally:
            self._busy.end(end_s)

    def _deliver_run(
        self, request_ids: Sequence[str], ends_s: Sequence[float], finished: list[FinishedRequest]
    ) -> None:
        gaps = [later - earlier for earlier, later in itertools.pairwise(ends_s)]
        self.generation_tokens_total += len(request_ids) * len(ends_s)
        for request_id in request_ids:
            self._listeners[request_id].tokens(ends_s, gaps)
        for request in finished:
            self._listeners.pop(request.request_id).finished(request)

    def _deliver(self, outcome: StepOutcome) -> None:
        self.generation_tokens_total += len(outcome.tokens)
        listeners = self._listeners
        for token in outcome.tokens:
            listeners[token.request_id].token(token.time_s)
        for request in outcome.finished:
            self._listeners.pop(request.request_id).finished(request)
