"""The streamed relays' pushed events (relay._push_events, preemptible._push_reads: the engine
connection's reads written to the client from its read callback) against a raw HTTP/1.1 engine
on port 0 whose pace, size and end each test sets: every byte in order, the pooled connection
handed back clean, the request's timeout, and a client that stops reading."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from admission_gateway.gateway import AdmissionGateway
from admission_gateway.upstream import PushedReads
from tests.support import wait_until
from tests.unit.admission_gateway.conftest import auth, make_config, with_preemptible

COMPLETION = {"model": "fake", "user": "A", "prompt": "Hi", "stream": True}


def event(index: int, padding: int = 0) -> bytes:
    choice = {"index": 0, "text": f"t{index} " + "x" * padding, "finish_reason": None}
    return b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n"


@dataclass
class RawEngine:
    """An engine speaking HTTP/1.1 by hand: each request gets `events` as one chunk each,
    written one at a time (`yield_between`) or all at once, then [DONE], unless `stall_after`
    holds the stream open after that many events."""

    events: list[bytes] = field(default_factory=list)
    yield_between: bool = True
    stall_after: int | None = None
    split_from: int | None = None
    """From this event on, each chunk is written in two halves, one read each."""
    chunks_per_event: int = 1
    """Chunks each event is framed in (written at once)."""
    connections: int = 0
    requests: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.requests += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                for index, data in enumerate(self.events):
                    if index == self.stall_after:
                        # Held open until the gateway gives up on it and closes the connection.
                        await writer.drain()
                        await reader.read()
                        return
                    step = -(-len(data) // self.chunks_per_event)
                    framed = b"".join(
                        b"%x\r\n%b\r\n" % (len(part), part)
                        for part in (data[at : at + step] for at in range(0, len(data), step))
                    )
                    if self.split_from is not None and index >= self.split_from:
                        writer.write(framed[: len(framed) // 2])
                        await writer.drain()
                        await asyncio.sleep(0.002)
                        framed = framed[len(framed) // 2 :]
                    writer.write(framed)
                    if self.yield_between:
                        await writer.drain()
                        await asyncio.sleep(0)
                writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@pytest_asyncio.fixture
async def raw_engine() -> AsyncIterator[RawEngine]:
    engine = RawEngine()
    engine.server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    yield engine
    for writer in engine.writers:
        writer.close()
    engine.server.close()
    await engine.server.wait_closed()


@pytest_asyncio.fixture
async def start(raw_engine: RawEngine) -> AsyncIterator[Callable[..., Awaitable[AdmissionGateway]]]:
    started: list[AdmissionGateway] = []

    async def start_gateway(
        preemptible: tuple[str, ...] = (), **gateway: object
    ) -> AdmissionGateway:
        """A gateway on the raw engine, the tenants named in `preemptible` preemptible."""
        config = with_preemptible(make_config(raw_engine.url, **gateway), preemptible)
        instance = AdmissionGateway(config, gateway_id="gw-test")
        await instance.start()
        started.append(instance)
        return instance

    yield start_gateway
    for instance in started:
        await instance.stop()


@pytest.mark.parametrize(
    "yield_between",
    # "bulk": the whole answer comes with the headers, so the task reads it all itself.
    [True, False],
    ids=["one read an event", "bulk"],
)
async def test_a_long_stream_arrives_whole_and_in_order_and_its_connection_serves_the_next(
    raw_engine: RawEngine,
    start: Callable[..., Awaitable[AdmissionGateway]],
    yield_between: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw_engine.events = [event(i) for i in range(500)]
    raw_engine.yield_between = yield_between
    started, framed = _count_pushes(monkeypatch)
    gateway = await start()
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(
                gateway.url + "/v1/completions", json=COMPLETION, headers=auth("A")
            ) as response:
                assert response.status == 200
                body = await response.read()
            assert body == b"".join(raw_engine.events) + b"data: [DONE]\n\n"
    # Both streams on one pooled connection: the first left it as it found it.
    assert (raw_engine.requests, raw_engine.connections) == (2, 1)
    if yield_between:
        # Both were pushed (after the first event, which goes out with the headers), and
        # nearly every event went out as the engine framed it, without the parser.
        assert len(started) == 2 and all(p is not None for p in started)
        assert framed[True] >= 2 * 490, framed
    await wait_until(lambda: gateway.admission("A").in_flight == 0)
    assert gateway.admission("A").completed_total == 2


def _count_pushes(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[PushedReads | None], dict[bool, int]]:
    """Every PushedReads started from now on, and how many events the reads its framed take took
    (True) and refused (False) held."""
    started: list[PushedReads | None] = []
    framed = {True: 0, False: 0}
    start_pushing = PushedReads.start.__func__  # type: ignore[attr-defined]

    def counted(cls: type[PushedReads], *args: Any, **kwargs: Any) -> PushedReads | None:
        take_framed = kwargs.get("take_framed")
        if take_framed is not None:

            def counting(read: bytes) -> bool:
                took: bool = take_framed(read)
                framed[took] += read.count(b"data: ")
                return took

            kwargs["take_framed"] = counting
        started.append(start_pushing(cls, *args, **kwargs))
        return started[-1]

    monkeypatch.setattr(PushedReads, "start", classmethod(counted))
    return started, framed


async def _one_stream(gateway: AdmissionGateway) -> bytes:
    """The body a client of tenant A reads of one streamed completion through `gateway`."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(gateway.url + "/v1/completions", json=COMPLETION, headers=auth("A")) as response,
    ):
        return await response.read()


async def test_a_stream_whose_chunks_arrive_split_is_relayed_whole_by_the_parser(
    raw_engine: RawEngine,
    start: Callable[..., Awaitable[AdmissionGateway]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # From the first chunk that comes in two reads on, the gateway cannot know where aiohttp's
    # parser stands without it: every later read goes to the parser, none out as framed.
    raw_engine.events = [event(i) for i in range(60)]
    raw_engine.split_from = 20
    _, framed = _count_pushes(monkeypatch)
    assert await _one_stream(await start()) == b"".join(raw_engine.events) + b"data: [DONE]\n\n"
    # Events 1 to 19 at most: the first goes out with the headers.
    assert 10 <= framed[True] <= 19, framed


async def test_chunks_that_do_not_each_end_an_event_are_parsed_and_relayed_whole(
    raw_engine: RawEngine,
    start: Callable[..., Awaitable[AdmissionGateway]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each event split over two chunks, both written at once (one read): the read is whole
    # chunks and ends an event, but its first chunk does not, so it is not taken as framed.
    raw_engine.events = [event(i) for i in range(30)]
    raw_engine.chunks_per_event = 2
    _, framed = _count_pushes(monkeypatch)
    assert await _one_stream(await start()) == b"".join(raw_engine.events) + b"data: [DONE]\n\n"
    assert framed[True] == 0 and framed[False] > 0, framed


async def test_a_stream_that_stalls_after_its_first_events_ends_with_the_timeout_event(
    raw_engine: RawEngine, start: Callable[..., Awaitable[AdmissionGateway]]
) -> None:
    raw_engine.events = [event(i) for i in range(10)]
    raw_engine.stall_after = 3
    gateway = await start(upstream_timeout_s=0.5)
    async with (
        aiohttp.ClientSession() as http,
        http.post(gateway.url + "/v1/completions", json=COMPLETION, headers=auth("A")) as response,
    ):
        body = await asyncio.wait_for(response.read(), timeout=10)
    assert body.startswith(b"".join(raw_engine.events[:3]))
    last = json.loads(body.rstrip().rsplit(b"\n\n", 1)[-1][6:])
    assert last["error"]["code"] == "upstream_timeout"
    await wait_until(lambda: gateway.admission("A").in_flight == 0, message="slot released")


async def test_a_client_that_stops_reading_stops_the_engine_and_then_gets_every_byte(
    raw_engine: RawEngine, start: Callable[..., Awaitable[AdmissionGateway]]
) -> None:
    # 48 MB, more than the loopback sockets' buffers hold: while the client reads nothing, the
    # gateway must stop reading the engine (its connection's reading paused) and hold at most
    # a few of its buffers' worth itself, then relay every byte once the client reads.
    raw_engine.events = [event(i, padding=4000) for i in range(12_000)]
    total = sum(len(data) for data in raw_engine.events) + len(b"data: [DONE]\n\n")
    gateway = await start()
    host, port = gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(COMPLETION).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Authorization: {auth('A')['Authorization']}\r\n".encode()
        + b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await writer.drain()
    # The gateway's one engine connection in use, and its one client connection.
    (engine_client,) = gateway._engines
    connections = engine_client._pool.open
    try:
        await wait_until(
            lambda: any(connection._reading_paused for connection in connections),
            timeout_s=30,
            message="the gateway's engine connection paused",
        )
        server = gateway._http
        assert server is not None
        (client_connection,) = server.connections
        assert client_connection.transport is not None
        assert client_connection.transport.get_write_buffer_size() < 1_000_000
        await reader.readuntil(b"\r\n\r\n")
        relayed = bytearray()
        while True:
            size = int(await reader.readuntil(b"\r\n"), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            relayed += chunk[:-2]
        assert len(relayed) == total
        assert bytes(relayed) == b"".join(raw_engine.events) + b"data: [DONE]\n\n"
    finally:
        writer.close()


def token_event(index: int) -> bytes:
    choice = {"index": 0, "text": f"t{index} ", "token_ids": [100 + index], "finish_reason": None}
    return b"data: " + json.dumps({"id": "c", "created": 1, "choices": [choice]}).encode() + b"\n\n"


async def _preemptible_events(
    gateway: AdmissionGateway, max_tokens: int
) -> tuple[list[dict[str, Any]], bool]:
    """The JSON events a client of tenant B reads of one streamed completion of token ids, and
    whether the stream ended with [DONE]."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            gateway.url + "/v1/completions",
            json={"model": "fake", "prompt": [1, 2, 3], "max_tokens": max_tokens, "stream": True},
            headers=auth("B"),
        ) as response,
    ):
        assert response.status == 200
        body = await asyncio.wait_for(response.read(), timeout=10)
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: {")]
    return events, body.endswith(b"data: [DONE]\n\n")


async def test_a_preemptible_stream_that_stalls_ends_with_an_error_event_at_its_timeout(
    raw_engine: RawEngine,
    start: Callable[..., Awaitable[AdmissionGateway]],
) -> None:
    # The preemptible relay pushes its reads too (preemptible._push_reads): its attempt's
    # timeout must still end a stream the engine stopped sending.
    raw_engine.events = [token_event(i) for i in range(10)]
    raw_engine.stall_after = 3
    gateway = await start(preemptible=("B",), upstream_timeout_s=0.5)
    texts, _ = await _preemptible_events(gateway, 10)
    assert [t["choices"][0]["text"] for t in texts[:3]] == ["t0 ", "t1 ", "t2 "]
    # Cut before its [DONE], the attempt ends as one whose engine went away.
    assert texts[-1]["error"]["code"] == "upstream_unavailable"
    await wait_until(lambda: gateway.admission("B").in_flight == 0, message="slot released")


async def test_a_long_preemptible_stream_is_relayed_in_order_from_framed_reads(
    raw_engine: RawEngine,
    start: Callable[..., Awaitable[AdmissionGateway]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw_engine.events = [token_event(i) for i in range(500)]
    started, framed = _count_pushes(monkeypatch)
    gateway = await start(preemptible=("B",))
    for _ in range(2):
        texts, done = await _preemptible_events(gateway, 500)
        assert done
        # Every token's text in order; the gateway's own closing chunk says no more.
        assert [t["choices"][0]["text"] for t in texts] == [f"t{i} " for i in range(500)] + [""]
    # Both on one pooled connection, whose parser the framed reads left between two chunks.
    assert (raw_engine.requests, raw_engine.connections) == (2, 1)
    assert len(started) == 2 and all(p is not None for p in started)
    # Nearly every event went to the relay as the engine framed it, without the parser.
    assert framed[True] >= 2 * 490, framed
    await wait_until(lambda: gateway.admission("B").in_flight == 0, message="slot released")
    assert gateway.admission("B").completed_total == 2


async def test_an_unreadable_event_in_a_framed_read_ends_the_preemptible_stream_with_an_error(
    raw_engine: RawEngine,
    start: Callable[..., Awaitable[AdmissionGateway]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What the relay raises for a framed read reaches the attempt's task, as for a parsed one
    # (raised from the read callback, it would only make the loop close the connection).
    raw_engine.events = [token_event(i) for i in range(100)]
    raw_engine.events[50] = b"data: not json\n\n"
    _, framed = _count_pushes(monkeypatch)
    gateway = await start(preemptible=("B",))
    texts, _ = await _preemptible_events(gateway, 100)
    assert [t["choices"][0]["text"] for t in texts[:-1]] == [f"t{i} " for i in range(50)]
    assert texts[-1]["error"]["code"] == "upstream_unavailable"
    # Told as the engine's unreadable answer, not as an engine gone away (which would route
    # the pool's next requests around it).
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("engine stream unreadable") for m in messages), messages
    assert not any("routing around it" in m for m in messages), messages
    assert framed[True] >= 40, framed
    await wait_until(lambda: gateway.admission("B").in_flight == 0, message="slot released")
