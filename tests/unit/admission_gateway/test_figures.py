"""RequestFigures: one call per figure feeds both the reported window and the histogram, and a
request's end writes one request-log record that says how it ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from admission_gateway.admission import Slot
from admission_gateway.errors import OpenAIError, upstream_timeout
from admission_gateway.figures import RequestFigures, RequestLog, RequestObservation
from admission_gateway.gateway_state import GatewayState
from admission_gateway.metrics import GatewayMetrics
from slotshift.clock import ManualClock
from slotshift.config import GatewayConfig, PoolConfig
from slotshift.request_log import (
    Outcome,
    RequestLogWriter,
    RequestRecord,
    SessionHasher,
    read_log,
)

POOL = PoolConfig.model_validate(
    {"name": "p", "budget_slots": 4, "tenants": [{"name": "A"}, {"name": "B"}]}
)


def _histogram(metrics: GatewayMetrics, name: str, tenant: str) -> tuple[float, float]:
    """(count, sum) of a gateway histogram's series for `tenant`."""
    labels = {"pool": "p", "tenant": tenant}
    count = metrics.registry.get_sample_value(f"{name}_count", labels)
    total = metrics.registry.get_sample_value(f"{name}_sum", labels)
    return (count or 0.0, total or 0.0)


@pytest.mark.parametrize(
    ("record", "window", "histogram"),
    [
        pytest.param(
            "first_token", "ttft", "slotshift_gateway_time_to_first_token_seconds", id="ttft"
        ),
        pytest.param("completed", "e2e", "slotshift_gateway_e2e_request_latency_seconds", id="e2e"),
    ],
)
def test_a_latency_goes_to_the_window_and_the_histogram_at_once(
    record: str, window: str, histogram: str
) -> None:
    clock = ManualClock()
    state = GatewayState(POOL, GatewayConfig(), clock)
    metrics = GatewayMetrics(state)
    figures = RequestFigures(metrics, clock)
    observed = figures.begin(
        state.tenants["A"], clock.monotonic(), route="/v1/completions", headers={}
    )
    clock.advance(0.25)

    getattr(observed, record)()

    percentiles = getattr(state.tenants["A"], window).percentiles()
    assert (percentiles.count, percentiles.p50_ms) == (1, 250.0)
    assert _histogram(metrics, histogram, "A") == (1.0, 0.25)
    assert getattr(state.tenants["B"], window).percentiles().count == 0
    assert _histogram(metrics, histogram, "B") == (0.0, 0.0)


# -- the request log's records --


async def _records(
    tmp_path: Path, play: Callable[[RequestFigures, GatewayState, ManualClock], None]
) -> list[RequestRecord]:
    """The records written while `play` drives observations of a gateway with a log on."""
    clock = ManualClock()
    state = GatewayState(POOL, GatewayConfig(), clock)
    figures = RequestFigures(GatewayMetrics(state), clock)
    writer = RequestLogWriter(
        tmp_path / "log.jsonl",
        max_bytes_per_file=1 << 20,
        files_kept=1,
        flush_interval_s=60.0,
        max_buffered_records=100,
    )
    figures.record_to(RequestLog(writer, "gw-0", SessionHasher(b"k" * 16)))
    play(figures, state, clock)
    await writer.close()
    return list(read_log(writer.path))


def _slot(state: GatewayState, wait_s: float) -> Slot:
    return Slot(state.tenants["A"].admission, wait_s, admitted_at_s=0.0)


def _begin(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> RequestObservation:
    return figures.begin(state.tenants["A"], clock.monotonic(), route="/v1/completions", headers={})


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _rejected(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
    observed = _begin(figures, state, clock)
    observed.asked({"prompt": "x", "max_tokens": 9, "stream": True, "user": "u"})
    clock.advance(0.003)
    observed.failed(OpenAIError(429, "full", error_type="rate_limit_error", code="queue_full"))


def _cancelled_in_queue(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
    observed = _begin(figures, state, clock)
    observed.asked({"prompt": "x"})
    clock.advance(1.5)
    observed.failed(asyncio.CancelledError())


def _stream_timed_out(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
    observed = _begin(figures, state, clock)
    observed.asked({"prompt": "x", "stream": True})
    observed.admitted(_slot(state, 0.25))
    clock.advance(0.5)
    # An engine sends an event a step, each its own read.
    observed.streamed(_event({"choices": [{"text": "a"}]}))
    observed.streamed(_event({"choices": [{"text": "b"}]}))
    clock.advance(1.0)
    observed.cut_by(upstream_timeout())
    observed.responded(200)


def _stream_cut_with_its_prompt_counted(
    figures: RequestFigures, state: GatewayState, clock: ManualClock
) -> None:
    observed = _begin(figures, state, clock)
    observed.asked({"prompt": "x", "stream": True})
    observed.prompt_counted(12)  # the engine's /tokenize, for a weighted pool
    observed.admitted(_slot(state, 0.0))
    observed.streamed(_event({"choices": [{"text": "a"}]}))
    observed.failed(asyncio.CancelledError())


def _stream_without_usage(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
    observed = _begin(figures, state, clock)
    observed.asked({"messages": [], "stream": True, "max_completion_tokens": 3})
    observed.admitted(_slot(state, 0.0))
    clock.advance(0.1)
    # Chat's role-only first event is no token; an event may be split across reads.
    observed.streamed(_event({"choices": [{"delta": {"role": "assistant"}}]}))
    content = _event({"choices": [{"delta": {"content": "hi"}}]})
    observed.streamed(content[:17])
    for read in (content[17:], content, content, b"data: [DONE]\n\n"):
        observed.streamed(read)
    observed.completed()
    observed.responded(200)


def _answer_with_usage(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
    observed = figures.begin(
        state.tenants["A"],
        clock.monotonic(),
        route="/v1/completions",
        headers={"X-Session-Id": "s-1"},
    )
    observed.asked({"prompt": "x", "max_tokens": 50, "user": "ignored-when-the-header-is-set"})
    observed.admitted(_slot(state, 0.0))
    clock.advance(0.2)
    observed.answered(
        200, json.dumps({"usage": {"prompt_tokens": 11, "completion_tokens": 7}}).encode()
    )
    observed.responded(200)


def _engine_refused(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
    observed = _begin(figures, state, clock)
    observed.asked({"prompt": "x", "max_tokens": 10**9})
    observed.admitted(_slot(state, 0.0))
    observed.answered(400, b'{"error": {"message": "too long"}}')
    observed.responded(400)


def _resumed(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
    observed = _begin(figures, state, clock)
    observed.asked({"prompt": [1, 2, 3], "max_tokens": 20, "stream": True})
    observed.admitted(_slot(state, 0.0))
    # The relay's own counts (token ids) win over counting events.
    observed.streamed(_event({"choices": [{"text": "a"}]}))
    observed.counted(prompt_tokens=3, output_tokens=20, pauses=2)
    observed.completed()
    observed.responded(200)


@pytest.mark.parametrize(
    ("play", "expected"),
    [
        pytest.param(
            _rejected,
            {
                "outcome": "rejected",
                "reason": "queue_full",
                "status": 429,
                "max_tokens": 9,
                "streamed": True,
                "queue_wait_ms": None,
                "output_tokens": None,
                "e2e_ms": 3.0,
            },
            id="rejected",
        ),
        pytest.param(
            _cancelled_in_queue,
            {
                "outcome": "cancelled",
                "reason": "client_disconnected",
                "status": None,
                "streamed": False,
                "e2e_ms": 1500.0,
                "session": None,
            },
            id="cancelled-while-queued",
        ),
        pytest.param(
            _stream_timed_out,
            {
                "outcome": "timed_out",
                "reason": "upstream_timeout",
                "status": 200,
                "queue_wait_ms": 250.0,
                "ttft_ms": 500.0,
                "e2e_ms": 1500.0,
                "output_tokens": 2,
                "output_tokens_from": "stream_events",
                "prompt_tokens": None,
            },
            id="stream-cut-by-a-timeout",
        ),
        pytest.param(
            _stream_without_usage,
            {
                "outcome": "completed",
                "route": "/v1/completions",
                "max_tokens": 3,
                "output_tokens": 3,
                "output_tokens_from": "stream_events",
                "ttft_ms": 100.0,
            },
            id="stream-counted-by-events",
        ),
        pytest.param(
            _answer_with_usage,
            {
                "outcome": "completed",
                "prompt_tokens": 11,
                "output_tokens": 7,
                "output_tokens_from": "usage",
                "session": SessionHasher(b"k" * 16).session("A", "s-1"),
                "ttft_ms": None,
                "e2e_ms": 200.0,
            },
            id="answer-with-usage",
        ),
        pytest.param(
            _engine_refused,
            {
                "outcome": "upstream_error",
                "reason": "engine_error",
                "status": 400,
                "output_tokens": None,
            },
            id="engine-error-status",
        ),
        pytest.param(
            _resumed,
            {
                "outcome": "completed",
                "prompt_tokens": 3,
                "output_tokens": 20,
                "output_tokens_from": "token_ids",
                "pauses": 2,
            },
            id="paused-and-resumed",
        ),
    ],
)
async def test_a_request_ends_in_one_record_that_says_how(
    tmp_path: Path,
    play: Callable[[RequestFigures, GatewayState, ManualClock], None],
    expected: dict[str, Any],
) -> None:
    (written,) = await _records(tmp_path, play)
    assert (written.tenant, written.gateway, written.pool) == ("A", "gw-0", "p")
    assert written.arrival_unix_s == ManualClock().wall()
    got = written.model_dump(mode="json")
    assert {name: got[name] for name in expected} == pytest.approx(expected)


async def test_a_request_ends_once_and_without_a_log_writes_nothing(tmp_path: Path) -> None:
    def twice(figures: RequestFigures, state: GatewayState, clock: ManualClock) -> None:
        observed = _begin(figures, state, clock)
        observed.responded(200)
        observed.failed(asyncio.CancelledError())
        figures.record_to(None)
        unlogged = _begin(figures, state, clock)
        assert not unlogged.recording
        unlogged.responded(200)

    records = await _records(tmp_path, twice)
    assert [r.outcome for r in records] == [Outcome.COMPLETED]


@pytest.mark.parametrize(
    ("play", "counted"),
    [
        pytest.param(_stream_timed_out, (0, 2), id="stream-cut-counts-its-events"),
        pytest.param(
            _stream_cut_with_its_prompt_counted, (12, 1), id="stream-cut-with-a-counted-prompt"
        ),
        pytest.param(_stream_without_usage, (0, 3), id="stream-without-usage"),
        pytest.param(_answer_with_usage, (11, 7), id="answer-with-usage"),
        pytest.param(_resumed, (3, 20), id="paused-and-resumed"),
        pytest.param(_engine_refused, None, id="engine-error-counts-nothing"),
        pytest.param(_rejected, None, id="rejected-counts-nothing"),
        pytest.param(_cancelled_in_queue, None, id="cancelled-while-queued-counts-nothing"),
    ],
)
@pytest.mark.parametrize("count_tokens", [True, False], ids=["counting", "not-counting"])
def test_the_tenant_is_counted_the_tokens_the_engine_answered_with(
    play: Callable[[RequestFigures, GatewayState, ManualClock], None],
    counted: tuple[int, int] | None,
    count_tokens: bool,
) -> None:
    clock = ManualClock()
    state = GatewayState(POOL, GatewayConfig(), clock)
    play(RequestFigures(GatewayMetrics(state), clock, count_tokens=count_tokens), state, clock)
    tokens = {
        model: (t.prompt_tokens_total, t.completion_tokens_total)
        for model, t in state.tenants["A"].tokens.items()
    }
    assert tokens == ({"": counted} if counted is not None and count_tokens else {})
    assert state.tenants["B"].tokens == {}
