"""The streaming client against a fake gateway: timings, token counts, every way to fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from slotshift.clock import SystemClock
from slotshift_tools.bench.arrivals import RequestShape
from slotshift_tools.bench.client import StreamingClient
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from tests.support import wait_until
from tests.unit.slotshift_tools.bench.fake_gateway import (
    FIRST_TOKEN_DELAY_S,
    FakeGateway,
    running_fake_gateway,
)

SHAPE = RequestShape(prompt_token_ids=[1001, 1002, 1003], max_tokens=5)


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with running_fake_gateway() as fake:
        yield fake


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session


def _client(session: aiohttp.ClientSession, timeout_s: float = 10.0) -> StreamingClient:
    clock = SystemClock()
    return StreamingClient(
        session, model="m", clock=clock, origin_s=clock.monotonic(), timeout_s=timeout_s
    )


def _trace(client: StreamingClient) -> RequestTrace:
    return RequestTrace(
        tenant="A", gateway=0, prompt_tokens=3, max_tokens=5, start_s=client.now_s()
    )


async def test_a_streamed_request_is_timed_chunk_by_chunk(
    gateway: FakeGateway, session: aiohttp.ClientSession
) -> None:
    client = _client(session)
    trace = _trace(client)
    await client.send(trace, gateway.url, "ok", SHAPE)
    assert trace.status is RequestStatus.OK
    assert trace.output_tokens == 5
    assert trace.ttft_s is not None and trace.ttft_s >= FIRST_TOKEN_DELAY_S
    assert len(trace.itl_s) == 4
    assert all(gap > 0 for gap in trace.itl_s)
    assert trace.first_token_s is not None and trace.end_s is not None
    assert trace.end_s >= trace.first_token_s + sum(trace.itl_s) - 1e-9
    (sent,) = gateway.requests
    assert sent["prompt"] == [1001, 1002, 1003]
    assert sent["max_tokens"] == 5
    assert sent["ignore_eos"] is True
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["model"] == "m"


async def test_a_request_not_streamed_gets_its_length_from_the_answers_usage(
    gateway: FakeGateway, session: aiohttp.ClientSession
) -> None:
    client = _client(session)
    trace = _trace(client)
    await client.send(trace, gateway.url, "ok", RequestShape([1001, 1002, 1003], 5, streamed=False))
    assert trace.status is RequestStatus.OK
    assert trace.output_tokens == 5
    # The client sees no token before the whole answer: no TTFT, no ITLs.
    assert trace.first_token_s is None and trace.itl_s == []
    assert trace.end_s is not None and trace.end_s - trace.start_s >= FIRST_TOKEN_DELAY_S
    (sent,) = gateway.requests
    assert sent["stream"] is False
    assert "stream_options" not in sent


async def test_without_usage_the_chunks_are_counted(
    gateway: FakeGateway, session: aiohttp.ClientSession
) -> None:
    client = _client(session)
    trace = _trace(client)
    await client.send(trace, gateway.url, "no-usage", SHAPE)
    assert trace.status is RequestStatus.OK
    assert trace.output_tokens == 5


@pytest.mark.parametrize(
    ("key", "error", "http_status"),
    [
        pytest.param("refuse", "HTTP 429: ", 429, id="refused"),
        pytest.param("error-event", "upstream_timeout", 200, id="error event"),
        pytest.param("cut", "without [DONE]", 200, id="stream cut short"),
    ],
)
async def test_failures_are_recorded(
    gateway: FakeGateway,
    session: aiohttp.ClientSession,
    key: str,
    error: str,
    http_status: int,
) -> None:
    client = _client(session)
    trace = _trace(client)
    await client.send(trace, gateway.url, key, SHAPE)
    assert trace.status is RequestStatus.FAILED
    assert trace.error is not None and error in trace.error
    assert trace.http_status == http_status
    assert trace.end_s is not None and trace.end_s >= trace.start_s


async def test_a_request_past_its_timeout_fails(
    gateway: FakeGateway, session: aiohttp.ClientSession
) -> None:
    client = _client(session, timeout_s=0.1)
    trace = _trace(client)
    await client.send(trace, gateway.url, "hang", SHAPE)
    assert trace.status is RequestStatus.FAILED
    assert trace.error == "no complete answer within 0.1 s"


async def test_an_unreachable_gateway_fails_the_request(session: aiohttp.ClientSession) -> None:
    client = _client(session)
    trace = _trace(client)
    await client.send(trace, "http://127.0.0.1:9", "ok", SHAPE)
    assert trace.status is RequestStatus.FAILED
    assert trace.error is not None and "Connect" in trace.error


async def test_a_cancelled_request_is_recorded_and_the_cancellation_goes_on(
    gateway: FakeGateway, session: aiohttp.ClientSession
) -> None:
    client = _client(session)
    trace = _trace(client)
    task = asyncio.create_task(client.send(trace, gateway.url, "hang", SHAPE))
    await wait_until(lambda: len(gateway.requests) == 1, message="the request to arrive")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert trace.status is RequestStatus.CANCELLED
    assert trace.end_s is not None
