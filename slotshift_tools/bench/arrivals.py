"""When requests are sent and what they ask for: pure functions of the scenario and a seeded RNG.

Open-loop processes (Poisson, gamma, on/off with a rate) are drawn up front as a list of send
times, so every run of a scenario sends at the same instants. Closed-loop processes (closed loop,
on/off with a concurrency) are a number of outstanding requests as a function of time; clients
refill on completion. Each tenant has its own random streams, derived from the scenario's seed
and the tenant's name: one for arrival gaps, one for request shapes, so changing one tenant's
lengths changes none of the other draws.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from slotshift_tools.bench.scenario import (
    Arrival,
    ClosedLoopArrival,
    GammaArrival,
    OnOffArrival,
    PoissonArrival,
    TokenCount,
)

PROMPT_TOKEN_ID_RANGE = (1000, 30000)
"""Prompt token ids are drawn from this range (ordinary vocabulary ids of common tokenizers,
clear of special tokens)."""


def tenant_rng(seed: int, tenant: str, stream: str) -> random.Random:
    """The random stream `stream` of one tenant; string seeds hash deterministically (SHA-512),
    whatever PYTHONHASHSEED is."""
    return random.Random(f"{seed}/{tenant}/{stream}")


def is_open_loop(arrival: Arrival) -> bool:
    """Whether the process sends at drawn times (True) or refills on completion (False)."""
    if isinstance(arrival, OnOffArrival):
        return arrival.rate_per_s is not None
    return isinstance(arrival, PoissonArrival | GammaArrival)


def on_at(arrival: OnOffArrival, t_s: float) -> bool:
    """Whether an on/off process is in a burst at t_s (bursts include their start)."""
    if t_s < arrival.first_on_s:
        return False
    return (t_s - arrival.first_on_s) % arrival.period_s < arrival.on_s


def next_on_start(arrival: OnOffArrival, t_s: float) -> float:
    """The start of the first burst at or after t_s (t_s itself when a burst starts then)."""
    if t_s <= arrival.first_on_s:
        return arrival.first_on_s
    cycles = math.ceil((t_s - arrival.first_on_s) / arrival.period_s)
    return arrival.first_on_s + cycles * arrival.period_s


def on_windows(arrival: OnOffArrival, horizon_s: float) -> list[tuple[float, float]]:
    """The bursts that start before horizon_s, as (start, end), the last one cut at horizon_s."""
    windows = []
    start = arrival.first_on_s
    while start < horizon_s:
        windows.append((start, min(start + arrival.on_s, horizon_s)))
        start += arrival.period_s
    return windows


def concurrency_at(arrival: ClosedLoopArrival | OnOffArrival, t_s: float) -> int:
    """Requests a closed-loop process keeps outstanding at t_s."""
    if isinstance(arrival, ClosedLoopArrival):
        return arrival.outstanding
    if arrival.concurrency is None:
        raise ValueError("an on/off process with a rate is open loop")
    return arrival.concurrency if on_at(arrival, t_s) else 0


def max_concurrency(arrival: ClosedLoopArrival | OnOffArrival) -> int:
    """The most requests a closed-loop process ever keeps outstanding (its number of clients)."""
    if isinstance(arrival, ClosedLoopArrival):
        return arrival.outstanding
    if arrival.concurrency is None:
        raise ValueError("an on/off process with a rate is open loop")
    return arrival.concurrency


def arrival_times(arrival: Arrival, rng: random.Random, horizon_s: float) -> list[float]:
    """Send times in [0, horizon_s) of an open-loop process, ascending."""
    if isinstance(arrival, PoissonArrival):
        return _renewal(lambda: rng.expovariate(arrival.rate_per_s), 0.0, horizon_s)
    if isinstance(arrival, GammaArrival):
        shape = arrival.burstiness
        # Mean gap shape x scale = 1/rate, as vllm bench serve draws them.
        scale = 1.0 / (arrival.rate_per_s * shape)
        return _renewal(lambda: rng.gammavariate(shape, scale), 0.0, horizon_s)
    if isinstance(arrival, OnOffArrival) and arrival.rate_per_s is not None:
        rate = arrival.rate_per_s
        times: list[float] = []
        # Exponential gaps are memoryless: restarting the draw at each burst's start is exact.
        for start, end in on_windows(arrival, horizon_s):
            times += _renewal(lambda: rng.expovariate(rate), start, end)
        return times
    raise ValueError(f"a {arrival.kind} process is closed loop: it has no arrival times")


def _renewal(gap: Callable[[], float], start_s: float, end_s: float) -> list[float]:
    times: list[float] = []
    t = start_s
    while True:
        t += gap()
        if t >= end_s:
            return times
        times.append(t)


def draw_length(count: TokenCount, rng: random.Random) -> int:
    """A length: the fixed count, or uniform over the range, both ends included."""
    if isinstance(count, int):
        return count
    return rng.randint(count.min_tokens, count.max_tokens)


@dataclass(frozen=True)
class RequestShape:
    """What one request asks for."""

    prompt_token_ids: list[int]
    max_tokens: int
    streamed: bool = True
    """Whether the answer is asked as a stream (the bench's own requests always are; a replayed
    request as it was recorded)."""


class RequestShapes:
    """A tenant's sequence of request shapes: the n-th request sent gets the n-th draw."""

    def __init__(self, prompt_tokens: TokenCount, output_tokens: TokenCount, rng: random.Random):
        self._prompt_tokens = prompt_tokens
        self._output_tokens = output_tokens
        self._rng = rng

    def next(self) -> RequestShape:
        prompt_length = draw_length(self._prompt_tokens, self._rng)
        max_tokens = draw_length(self._output_tokens, self._rng)
        low, high = PROMPT_TOKEN_ID_RANGE
        return RequestShape(uniform_ids(self._rng, low, high, prompt_length), max_tokens)


def uniform_ids(rng: random.Random, low: int, high: int, count: int) -> list[int]:
    """`count` draws of `rng.randrange(low, high)`, the same values from the same generator
    state (tests/unit/slotshift_tools/bench/test_arrivals.py checks it), at a third of the
    cost: randrange's own algorithm (getrandbits of the width's bit length, drawn again while
    out of range: CPython's Random._randbelow_with_getrandbits) without its two calls per draw.
    Prompts are drawn a token at a time, and the twin draws every one of a run's."""
    width = high - low
    bits = width.bit_length()
    getrandbits = rng.getrandbits
    ids: list[int] = []
    append = ids.append
    for _ in range(count):
        value = getrandbits(bits)
        while value >= width:
            value = getrandbits(bits)
        append(low + value)
    return ids
