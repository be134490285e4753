"""Waste: engine work no client received, from the engine's and the gateways' counters."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from slotshift_tools.bench.sampler import Sample, gateway_waste
from slotshift_tools.bench.stats import Window
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from slotshift_tools.bench.waste import (
    DISCARDED_OUTPUT,
    RECOMPUTED_PROMPT,
    Waste,
    first_prefill_prompt_tokens,
    pool_waste,
    received_tokens,
    tenant_waste,
)
from tests.unit.slotshift_tools.bench.traces import done

WINDOW = Window(10.0, 20.0)


def engine(
    t_s: float,
    generated: float | None,
    queries: float | None = None,
    hits: float | None = None,
) -> Sample:
    return Sample(
        t_s=t_s,
        wall_s=t_s,
        engine_generation_tokens=generated,
        engine_prefix_cache_queries=queries,
        engine_prefix_cache_hits=hits,
    )


def gateways(t_s: float, reading: dict[str, dict[str, float]] | None) -> Sample:
    return Sample(t_s=t_s, wall_s=t_s, gateway_waste_tokens=reading)


def chunks(tenant: str, first_s: float, count: int, *, prompt_tokens: int = 10) -> RequestTrace:
    """A request whose `count` chunks arrive 0.1 s apart from first_s, one token each."""
    return done(tenant, first_s - 0.05, 0.05, [0.1] * (count - 1), prompt_tokens=prompt_tokens)


def test_received_tokens_count_the_chunks_inside_the_span() -> None:
    trace = chunks("A", 9.75, 6)  # chunks at 9.75, 9.85, 9.95, 10.05, 10.15, 10.25
    assert received_tokens(trace, WINDOW) == 3


def test_a_chunk_carries_an_even_share_of_its_requests_output() -> None:
    trace = chunks("A", 12.0, 4)
    trace.output_tokens = 8  # the usage says 8 tokens in 4 chunks
    assert received_tokens(trace, Window(12.05, 20.0)) == 6


def test_a_request_still_running_counts_one_token_a_chunk() -> None:
    trace = chunks("B", 19.05, 30)  # chunks from 19.05 to 21.95: running at the span's end
    trace.status, trace.output_tokens = RequestStatus.CANCELLED, 0  # no usage recorded
    assert received_tokens(trace, WINDOW) == 10


def test_a_request_without_a_first_token_received_nothing() -> None:
    trace = RequestTrace(tenant="A", gateway=0, prompt_tokens=5, max_tokens=5, start_s=12.0)
    assert received_tokens(trace, WINDOW) == 0
    assert first_prefill_prompt_tokens([trace], WINDOW) == 0


def test_first_prefills_are_the_requests_whose_first_token_arrived_in_the_span() -> None:
    traces = [
        chunks("A", 9.0, 30, prompt_tokens=100),  # first token before the span: not counted
        chunks("A", 11.0, 3, prompt_tokens=20),
        chunks("B", 19.5, 30, prompt_tokens=7),  # ends after the span: its prefill is inside
    ]
    assert first_prefill_prompt_tokens(traces, WINDOW) == 27


def test_pool_waste_is_what_the_engine_computed_beyond_what_the_clients_got() -> None:
    traces = [chunks("A", 11.0, 50, prompt_tokens=30), chunks("B", 12.0, 40, prompt_tokens=20)]
    samples = [
        engine(5.0, 0.0, 0.0, 0.0),  # warm-up: ignored
        engine(10.0, 1000.0, 500.0, 100.0),
        engine(15.0, 1050.0, 560.0, 100.0),
        engine(20.0, 1100.0, 700.0, 100.0),
    ]
    waste = pool_waste(samples, traces, WINDOW)
    # Generated 100, received 90: 10 discarded. Computed 600 - 400 = 200 prompt tokens, of
    # which 50 were the two requests' first prefills: 150 recomputed.
    assert waste == Waste(10.0, 150.0, 90.0)
    assert waste.tokens == 160.0
    assert waste.percent == pytest.approx(100.0 * 160 / 90)


def test_the_span_runs_between_the_moments_the_counters_were_read() -> None:
    # Read 0.5 s after each sample began: the chunks at 10.05 .. 10.45 came before the span.
    first, last = engine(10.0, 0.0, 0.0, 0.0), engine(19.5, 45.0, 60.0, 0.0)
    first.engine_read_s, last.engine_read_s = 10.5, 20.0
    early = chunks("A", 10.05, 50, prompt_tokens=60)  # chunks 10.05 .. 14.95
    waste = pool_waste([first, last], [early], WINDOW)
    assert waste.received_output_tokens == 45
    assert waste.discarded_output_tokens == 0.0
    # Its first prefill came before the span, so the 60 prompt tokens computed in it are waste.
    assert waste.recomputed_prompt_tokens == 60.0


def test_pool_waste_is_clamped_at_zero() -> None:
    traces = [chunks("A", 11.0, 50, prompt_tokens=300)]
    samples = [engine(10.0, 0.0, 0.0, 0.0), engine(20.0, 45.0, 100.0, 0.0)]
    waste = pool_waste(samples, traces, WINDOW)
    assert (waste.discarded_output_tokens, waste.recomputed_prompt_tokens) == (0.0, 0.0)
    assert waste.percent == 0.0


def test_without_prefix_cache_counters_the_waste_is_unknown_not_zero() -> None:
    samples = [engine(10.0, 0.0), engine(20.0, 60.0)]
    waste = pool_waste(samples, [chunks("A", 11.0, 50)], WINDOW)
    assert waste.discarded_output_tokens == 10.0
    assert waste.recomputed_prompt_tokens is None
    assert (waste.tokens, waste.percent) == (None, None)
    assert waste.figures() == {
        "waste_tokens": None,
        "waste_percent": None,
        "waste_discarded_output_tokens": 10.0,
        "waste_recomputed_prompt_tokens": None,
    }


@pytest.mark.parametrize(
    "samples",
    [
        pytest.param([], id="no samples"),
        pytest.param([engine(12.0, 10.0, 1.0, 0.0)], id="one reading"),
        pytest.param([engine(5.0, 1.0), engine(25.0, 9.0)], id="readings outside the window"),
        pytest.param([engine(10.0, None), engine(20.0, None)], id="no generation counter"),
    ],
)
def test_without_two_readings_in_the_window_nothing_is_known(samples: list[Sample]) -> None:
    waste = pool_waste(samples, [chunks("A", 11.0, 5)], WINDOW)
    assert waste == Waste(None, None, None)


def test_no_output_gives_no_percentage() -> None:
    waste = pool_waste([engine(10.0, 0.0, 0.0, 0.0), engine(20.0, 5.0, 0.0, 0.0)], [], WINDOW)
    assert waste.tokens == 5.0
    assert waste.percent is None


def test_a_tenants_waste_is_the_increase_of_the_gateways_counters() -> None:
    traces = [chunks("B", 11.0, 40), chunks("A", 11.0, 10)]
    samples = [
        gateways(10.0, {"A": {DISCARDED_OUTPUT: 3.0}}),
        gateways(15.0, None),  # a gateway did not answer: skipped
        gateways(20.0, {"A": {DISCARDED_OUTPUT: 3.0}, "B": {RECOMPUTED_PROMPT: 4.0}}),
    ]
    b = tenant_waste(samples, traces, WINDOW, "B")
    assert b == Waste(0.0, 4.0, 40.0)
    assert b.percent == 10.0
    assert tenant_waste(samples, traces, WINDOW, "A") == Waste(0.0, 0.0, 10.0)


def test_without_the_gateways_counter_a_tenants_waste_is_unknown() -> None:
    samples = [gateways(10.0, None), gateways(20.0, None)]
    assert tenant_waste(samples, [chunks("A", 11.0, 5)], WINDOW, "A") == Waste(None, None, None)


GATEWAY_0 = """\
# HELP slotshift_gateway_waste_tokens_total Tokens wasted.
# TYPE slotshift_gateway_waste_tokens_total counter
slotshift_gateway_waste_tokens_total{tenant="B",kind="discarded_output"} 5.0
slotshift_gateway_waste_tokens_created{tenant="B",kind="discarded_output"} 1.7e9
slotshift_gateway_waste_tokens_total{tenant="B",kind="recomputed_prompt"} 7.0
"""
GATEWAY_1 = """\
# TYPE slotshift_gateway_waste_tokens_total counter
slotshift_gateway_waste_tokens_total{tenant="B",kind="discarded_output"} 2.0
slotshift_gateway_waste_tokens_total{tenant="C",kind="recomputed_prompt"} 1.0
"""
DECLARED_ONLY = """\
# HELP slotshift_gateway_waste_tokens_total Tokens wasted.
# TYPE slotshift_gateway_waste_tokens_total counter
"""
OTHER = """\
# TYPE slotshift_gateway_requests_total counter
slotshift_gateway_requests_total{tenant="B"} 9.0
"""


def test_the_gateways_counters_are_summed_by_tenant_and_kind() -> None:
    assert gateway_waste([GATEWAY_0, GATEWAY_1]) == {
        "B": {DISCARDED_OUTPUT: 7.0, RECOMPUTED_PROMPT: 7.0},
        "C": {RECOMPUTED_PROMPT: 1.0},
    }


def test_a_declared_counter_without_samples_is_no_waste_yet() -> None:
    assert gateway_waste([DECLARED_ONLY, DECLARED_ONLY]) == {}


def test_a_gateway_without_the_counter_makes_the_reading_unknown() -> None:
    assert gateway_waste([GATEWAY_0, OTHER]) is None


def test_the_counter_is_read_as_prometheus_client_exposes_it() -> None:
    registry = CollectorRegistry()
    counter = Counter(
        "slotshift_gateway_waste_tokens", "Tokens wasted.", ["tenant", "kind"], registry=registry
    )
    counter.labels(tenant="B", kind=DISCARDED_OUTPUT).inc(5)
    counter.labels(tenant="B", kind=RECOMPUTED_PROMPT).inc(7)
    text = generate_latest(registry).decode()
    assert gateway_waste([text]) == {"B": {DISCARDED_OUTPUT: 5.0, RECOMPUTED_PROMPT: 7.0}}
