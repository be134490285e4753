"""The mixed load that prices token accounting: plain, cancelled and paused streams at once.

Token accounting (admission_gateway/token_usage.py) touches every relayed read of a plain stream,
the end of every request, and the usage of a resumable one; its price is measured on a load that
has all of them, through two gateways side by side that differ only in `gateway.count_tokens`:

- the batch tenant's streams, every `cut_every`-th of them cut by its client after a few events
  (the gateway then counts what the engine delivered);
- the preemptible tenant's streams, more of them than its share, so that they run on slots
  borrowed from the interactive tenant;
- the interactive tenant's bursts of short streams, every `burst_interval_s`: it takes its share
  back, and the control plane pauses the preemptible tenant's borrowed work, which resumes after
  the burst.

Events are counted as the clients receive them (every tenant's), so the figure is CPU per 1,000
relayed events of the whole mix, as in the plain and preemptible windows.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from slotshift.aiotasks import Supervisor
from slotshift_tools.gateway_bench.measure import EventCounter, Target, stream_once
from slotshift_tools.gateway_bench.processes import BATCH, INTERACTIVE, PREEMPTIBLE


@dataclass
class MixLoad:
    """The mixed load through one target (module docstring); start, window, stop."""

    target: Target
    batch_streams: int
    preemptible_streams: int
    burst_streams: int
    max_tokens: int
    burst_interval_s: float
    cut_every: int = 4
    """Every this-many-th batch stream is cut by its client."""
    counter: EventCounter = field(default_factory=EventCounter)
    errors: list[str] = field(default_factory=list)
    requests: int = 0
    cut: int = 0
    """Streams their client cut."""
    bursts: int = 0

    def __post_init__(self) -> None:
        self._tasks = Supervisor(f"bench-gateway-mix/{self.target.name}")

    def start(self, session: aiohttp.ClientSession) -> None:
        """Start the streams and the bursts (each a named, supervised task)."""
        for index in range(self.batch_streams):
            self._tasks.spawn(f"batch-{index}", self._streams(session, BATCH, index))
        for index in range(self.preemptible_streams):
            self._tasks.spawn(f"preemptible-{index}", self._streams(session, PREEMPTIBLE, None))
        self._tasks.spawn("bursts", self._bursts(session))

    async def stop(self) -> None:
        """Cancel everything and wait for it."""
        await self._tasks.stop()

    async def _streams(self, session: aiohttp.ClientSession, tenant: str, lane: int | None) -> None:
        made = 0
        while True:
            made += 1
            # Cut streams end at different points, so that cuts land between every kind of read.
            cut_after = None
            if lane is not None and (made + lane) % self.cut_every == 0:
                cut_after = 1 + (made * 7 + lane) % max(1, self.max_tokens // 2)
            await self._one(session, tenant, self.max_tokens, cut_after)

    async def _bursts(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.burst_interval_s)
            self.bursts += 1
            await asyncio.gather(
                *(
                    self._one(session, INTERACTIVE, self.max_tokens // 4, None)
                    for _ in range(self.burst_streams)
                )
            )

    async def _one(
        self, session: aiohttp.ClientSession, tenant: str, max_tokens: int, cut_after: int | None
    ) -> None:
        ended = await stream_once(
            session, self.target, tenant, max_tokens, self.counter, self.errors, cut_after=cut_after
        )
        if ended != "failed":
            self.requests += 1
        if ended == "cut":
            self.cut += 1
