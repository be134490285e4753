"""Arrival processes and request shapes: seeded, exact, shaped as the scenario says."""

from __future__ import annotations

import random
import statistics

import pytest

from slotshift_tools.bench.arrivals import (
    PROMPT_TOKEN_ID_RANGE,
    RequestShapes,
    arrival_times,
    concurrency_at,
    draw_length,
    is_open_loop,
    next_on_start,
    on_at,
    on_windows,
    tenant_rng,
    uniform_ids,
)
from slotshift_tools.bench.scenario import (
    ClosedLoopArrival,
    GammaArrival,
    OnOffArrival,
    PoissonArrival,
    TokenRange,
)

BURSTS = OnOffArrival(kind="on_off", on_s=2.0, off_s=3.0, first_on_s=1.0, concurrency=4)


@pytest.mark.parametrize(
    ("t_s", "on", "next_start"),
    [
        pytest.param(0.0, False, 1.0, id="before the first burst"),
        pytest.param(1.0, True, 1.0, id="a burst starts"),
        pytest.param(2.9, True, 6.0, id="in a burst"),
        pytest.param(3.0, False, 6.0, id="a burst ends"),
        pytest.param(5.99, False, 6.0, id="late in a pause"),
        pytest.param(6.0, True, 6.0, id="the second burst starts"),
    ],
)
def test_on_off_phases(t_s: float, on: bool, next_start: float) -> None:
    assert on_at(BURSTS, t_s) is on
    assert next_on_start(BURSTS, t_s) == pytest.approx(next_start)
    assert concurrency_at(BURSTS, t_s) == (4 if on else 0)


def test_on_windows_are_cut_at_the_horizon() -> None:
    assert on_windows(BURSTS, 12.0) == [(1.0, 3.0), (6.0, 8.0), (11.0, 12.0)]


def test_a_closed_loop_keeps_its_outstanding_always() -> None:
    loop = ClosedLoopArrival(kind="closed_loop", outstanding=128)
    assert not is_open_loop(loop)
    assert concurrency_at(loop, 0.0) == concurrency_at(loop, 1e6) == 128
    with pytest.raises(ValueError, match="closed loop"):
        arrival_times(loop, tenant_rng(1, "B", "arrivals"), 10.0)


def test_poisson_arrivals_are_seeded_and_at_the_rate() -> None:
    process = PoissonArrival(kind="poisson", rate_per_s=50.0)
    first = arrival_times(process, tenant_rng(7, "A", "arrivals"), 200.0)
    again = arrival_times(process, tenant_rng(7, "A", "arrivals"), 200.0)
    other = arrival_times(process, tenant_rng(7, "B", "arrivals"), 200.0)
    assert first == again
    assert first != other
    assert first == sorted(first)
    assert first[0] > 0.0 and first[-1] < 200.0
    assert len(first) / 200.0 == pytest.approx(50.0, rel=0.03)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_rate_and_cv_of_vllms_burstiness(burstiness: float) -> None:
    process = GammaArrival(kind="gamma", rate_per_s=20.0, burstiness=burstiness)
    times = arrival_times(process, tenant_rng(3, "A", "arrivals"), 2000.0)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 20.0, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(burstiness**-0.5, rel=0.05)


def test_on_off_with_a_rate_sends_only_while_on() -> None:
    process = OnOffArrival(kind="on_off", on_s=1.0, off_s=1.0, rate_per_s=100.0)
    assert is_open_loop(process)
    times = arrival_times(process, tenant_rng(1, "A", "arrivals"), 20.0)
    assert all(on_at(process, t) for t in times)
    assert len(times) / 10.0 == pytest.approx(100.0, rel=0.1)  # 10 s of bursts
    with pytest.raises(ValueError, match="open loop"):
        concurrency_at(process, 0.5)


def test_lengths_are_fixed_or_drawn_from_the_whole_range() -> None:
    rng = tenant_rng(1, "A", "requests")
    assert draw_length(64, rng) == 64
    drawn = {draw_length(TokenRange(min_tokens=3, max_tokens=5), rng) for _ in range(200)}
    assert drawn == {3, 4, 5}


def test_request_shapes_are_exact_and_repeat_with_the_seed() -> None:
    def shapes() -> RequestShapes:
        return RequestShapes(
            TokenRange(min_tokens=10, max_tokens=20), 64, tenant_rng(9, "A", "requests")
        )

    first, again = shapes(), shapes()
    for _ in range(20):
        shape = first.next()
        assert shape == again.next()
        assert 10 <= len(shape.prompt_token_ids) <= 20
        assert shape.max_tokens == 64
        low, high = PROMPT_TOKEN_ID_RANGE
        assert all(low <= t < high for t in shape.prompt_token_ids)


@pytest.mark.parametrize(
    ("low", "high"),
    [PROMPT_TOKEN_ID_RANGE, (0, 1), (5, 6), (0, 1 << 20), (3, (1 << 20) + 1), (-7, 93)],
)
def test_uniform_ids_are_randranges_draws(low: int, high: int) -> None:
    """The same values as randrange from the same generator state, and the generator left in
    the same state (what comes after the prompt does not move)."""
    ours, theirs = random.Random(11), random.Random(11)
    assert uniform_ids(ours, low, high, 2000) == [theirs.randrange(low, high) for _ in range(2000)]
    assert ours.random() == theirs.random()
