"""The client side of the bench: sequential latency, concurrent streams, the interference window.

- latency: `pairs` rounds; each round sends one request to every target, one after the other,
  the targets' order rotated from round to round, so that a target never always goes first and
  drift of the machine hits all alike; round i gives pair i (through vs direct);
- streams: `streams` concurrent streamed completions of one tenant through one target, each
  started again when it ends; over a window after a warm-up, the events the client received
  and the CPU seconds of the relaying process (and of the upstream, this harness and the host);
- interference: the same streams of the batch tenant through one target, and meanwhile the
  interactive tenant's streamed requests, paired with direct ones, one after the other.

The client is aiohttp, the same for every target, so its own cost cancels in the differences;
its CPU is reported so that a reader sees whether it was the bottleneck.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import aiohttp

from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock
from slotshift_tools.gateway_bench.upstream import MODEL
from slotshift_tools.scale import procfs

PROMPT = "Say something short about the sea."
NON_STREAMED_MAX_TOKENS = 16
TTFT_MAX_TOKENS = 2
"""A TTFT probe's stream is short: only its first token is measured."""


@dataclass(frozen=True)
class Target:
    """One way to the engine: a name, a base URL, and the tenants' keys to send (none direct)."""

    name: str
    url: str
    keys: dict[str, str] | None


class BenchRequestError(RuntimeError):
    """A request of the bench failed (status or connection): the run is not valid."""


def completion_body(*, stream: bool, max_tokens: int) -> dict[str, Any]:
    """A text completion of the bench's prompt (a resumable shape: plain sampling)."""
    body: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return body


def _headers(target: Target, tenant: str) -> dict[str, str]:
    if target.keys is None:
        return {}
    return {"Authorization": f"Bearer {target.keys[tenant]}"}


class EventCounter:
    """Counts SSE events (blank-line ends) in a byte stream cut anywhere."""

    def __init__(self) -> None:
        self.events = 0
        self._last = b""

    def feed(self, chunk: bytes) -> None:
        """Count the event ends that `chunk` completes."""
        if not chunk:
            return
        # An event's end `\n\n` may straddle two reads.
        if self._last == b"\n" and chunk[:1] == b"\n":
            self.events += 1
        self.events += chunk.count(b"\n\n")
        self._last = chunk[-1:]


async def non_streamed_s(
    session: aiohttp.ClientSession, target: Target, tenant: str, clock: Clock
) -> float:
    """Seconds from sending a non-streamed completion to its whole answer."""
    body = completion_body(stream=False, max_tokens=NON_STREAMED_MAX_TOKENS)
    started = clock.monotonic()
    async with session.post(
        f"{target.url}/v1/completions", json=body, headers=_headers(target, tenant)
    ) as response:
        await response.read()
        ended = clock.monotonic()
        if response.status != 200:
            raise BenchRequestError(f"{target.name}: status {response.status}")
    return ended - started


async def non_streamed_after_idle_s(
    session: aiohttp.ClientSession,
    target: Target,
    tenant: str,
    clock: Clock,
    *,
    idle_s: float,
) -> float:
    """`non_streamed_s` after `idle_s` of nothing to do: the control of the TTFT probe, whose
    stream leaves every process idle between its two tokens. On a virtual machine, a process
    that has been idle for a few milliseconds runs slower for a while (its caches cold, its
    virtual CPU halted and woken), so a request after an idle spell costs more, through any
    proxy alike, whatever the proxy does."""
    await asyncio.sleep(idle_s)
    return await non_streamed_s(session, target, tenant, clock)


async def ttft_s(
    session: aiohttp.ClientSession, target: Target, tenant: str, clock: Clock
) -> float:
    """Seconds from sending a streamed completion to its first event (the first token: a
    completion's stream starts with it); the stream is read to its end."""
    body = completion_body(stream=True, max_tokens=TTFT_MAX_TOKENS)
    started = clock.monotonic()
    first: float | None = None
    async with session.post(
        f"{target.url}/v1/completions", json=body, headers=_headers(target, tenant)
    ) as response:
        if response.status != 200:
            await response.read()
            raise BenchRequestError(f"{target.name}: status {response.status}")
        async for chunk in response.content.iter_any():
            if first is None and b"data:" in chunk:
                first = clock.monotonic()
    if first is None:
        raise BenchRequestError(f"{target.name}: a stream with no event")
    return first - started


Probe = Callable[[aiohttp.ClientSession, Target, str, Clock], Any]


async def paired_latency(
    sessions: dict[str, aiohttp.ClientSession],
    targets: Sequence[Target],
    probe: Probe,
    pairs: int,
    clock: Clock,
    *,
    tenant: str,
    rotation_offset: int = 0,
) -> dict[str, list[float]]:
    """`pairs` rounds of one `probe` per target (module docstring); each target's seconds, in
    round order (element i of every list is round i)."""
    samples: dict[str, list[float]] = {t.name: [] for t in targets}
    count = len(targets)
    for index in range(pairs):
        shift = (index + rotation_offset) % count
        for target in (*targets[shift:], *targets[:shift]):
            samples[target.name].append(await probe(sessions[target.name], target, tenant, clock))
    return samples


class Load(Protocol):
    """Streams that run through a window: StreamLoad, or the accounting mix (mix.py)."""

    counter: EventCounter
    errors: list[str]
    requests: int

    def start(self, session: aiohttp.ClientSession) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class StreamLoad:
    """Concurrent streams of one tenant through one target (start, then window, then stop)."""

    target: Target
    tenant: str
    streams: int
    max_tokens: int
    counter: EventCounter = field(default_factory=EventCounter)
    errors: list[str] = field(default_factory=list)
    requests: int = 0

    def __post_init__(self) -> None:
        self._tasks = Supervisor(f"bench-gateway-streams/{self.target.name}/{self.tenant}")

    def start(self, session: aiohttp.ClientSession) -> None:
        """Start the streams (each a named, supervised task)."""
        for index in range(self.streams):
            self._tasks.spawn(f"stream-{index}", self._run(session))

    async def stop(self) -> None:
        """Cancel the streams and wait for them."""
        await self._tasks.stop()

    async def _run(self, session: aiohttp.ClientSession) -> None:
        while True:
            ended = await stream_once(
                session, self.target, self.tenant, self.max_tokens, self.counter, self.errors
            )
            if ended != "failed":
                self.requests += 1


async def stream_once(
    session: aiohttp.ClientSession,
    target: Target,
    tenant: str,
    max_tokens: int,
    counter: EventCounter,
    errors: list[str],
    *,
    cut_after: int | None = None,
) -> Literal["done", "cut", "failed"]:
    """One streamed completion of `tenant` through `target`, its events counted into `counter`;
    with `cut_after`, its client closes the connection after that many events (the proxy sees
    its client go away). A failure goes to `errors`, after a short pause so that a failing
    target is not hammered."""
    body = completion_body(stream=True, max_tokens=max_tokens)
    try:
        async with session.post(
            f"{target.url}/v1/completions", json=body, headers=_headers(target, tenant)
        ) as response:
            if response.status != 200:
                errors.append(f"{tenant}: status {response.status}")
                await response.read()
                await asyncio.sleep(0.1)
                return "failed"
            seen = EventCounter()
            async for chunk in response.content.iter_any():
                counter.feed(chunk)
                if cut_after is None:
                    continue
                seen.feed(chunk)
                if seen.events >= cut_after:
                    # Leaving without reading the rest closes the connection.
                    response.close()
                    return "cut"
        return "done"
    except aiohttp.ClientError as exc:
        errors.append(f"{tenant}: {type(exc).__name__}: {exc}")
        await asyncio.sleep(0.1)
        return "failed"


@dataclass(frozen=True)
class CpuMark:
    """CPU seconds of the watched processes, the harness and the host at one moment."""

    at_s: float
    processes_s: dict[str, float]
    harness_s: float
    host: procfs.HostCpu


def cpu_mark(pids: dict[str, int], clock: Clock) -> CpuMark:
    """Read every watched process's CPU seconds now (a process gone reads 0)."""
    values = {}
    for name, pid in pids.items():
        try:
            values[name] = procfs.process_cpu_s(pid)
        except OSError:
            values[name] = 0.0
    return CpuMark(
        at_s=clock.monotonic(),
        processes_s=values,
        harness_s=procfs.process_cpu_s(os.getpid()),
        host=procfs.host_cpu(),
    )


@dataclass(frozen=True)
class Window:
    """What one measured window saw."""

    seconds: float
    events: int
    cpu_s: dict[str, float]
    """CPU seconds each watched process spent in the window, by role."""
    harness_cpu_s: float
    host_busy_cores: float

    def cores(self, name: str) -> float:
        """The process's CPU over the window, in cores."""
        return self.cpu_s.get(name, 0.0) / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "events": self.events,
            "events_per_s": self.events / self.seconds if self.seconds > 0 else 0.0,
            "cores": {name: self.cores(name) for name in self.cpu_s},
            "harness_cores": self.harness_cpu_s / self.seconds if self.seconds > 0 else 0.0,
            "host_busy_cores": self.host_busy_cores,
        }


def window_between(before: CpuMark, after: CpuMark, events: int) -> Window:
    """The window from `before` to `after`, with `events` received in it."""
    seconds = after.at_s - before.at_s
    busy = after.host.busy_s - before.host.busy_s
    return Window(
        seconds=seconds,
        events=events,
        cpu_s={n: after.processes_s[n] - before.processes_s[n] for n in before.processes_s},
        harness_cpu_s=after.harness_s - before.harness_s,
        host_busy_cores=busy / seconds if seconds > 0 else 0.0,
    )


async def measure_streams(
    session: aiohttp.ClientSession,
    load: Load,
    pids: dict[str, int],
    clock: Clock,
    *,
    warmup_s: float,
    window_s: float,
    during: Callable[[], Any] | None = None,
) -> tuple[Window, Any]:
    """Run `load`; after `warmup_s`, a window of `window_s` (or as long as `during()` takes,
    when given: the interference probes run inside the window). The window, and what
    `during()` returned."""
    windows, result = await measure_together(
        {"load": (session, load)}, pids, clock, warmup_s=warmup_s, window_s=window_s, during=during
    )
    return windows["load"], result


async def measure_together(
    loads: Mapping[str, tuple[aiohttp.ClientSession, Load]],
    pids: dict[str, int],
    clock: Clock,
    *,
    warmup_s: float,
    window_s: float,
    during: Callable[[], Any] | None = None,
) -> tuple[dict[str, Window], Any]:
    """`measure_streams` of several loads at once (each on its own session), in one window:
    each load's window (the same moments and CPU readings, its own events)."""
    for session, load in loads.values():
        load.start(session)
    try:
        await asyncio.sleep(warmup_s)
        before = cpu_mark(pids, clock)
        events_before = {name: load.counter.events for name, (_, load) in loads.items()}
        result = None
        if during is not None:
            result = await during()
        else:
            await asyncio.sleep(window_s)
        after = cpu_mark(pids, clock)
        events = {
            name: load.counter.events - events_before[name] for name, (_, load) in loads.items()
        }
    finally:
        for _, load in loads.values():
            await load.stop()
    return {name: window_between(before, after, events[name]) for name in loads}, result
