"""The connections to the engine: a request the engine never received is sent again, once; one it
may have received never is; idle pooled connections are dropped before the engine drops them.

The engine here is a raw asyncio server, so that what it does to a connection is exact: it
answers a number of requests on each connection with keep-alive, then does one of the things a
real server does to the next request on it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import pytest
import pytest_asyncio
from pydantic import SecretStr, ValidationError

from admission_gateway.gateway import AdmissionGateway
from admission_gateway.upstream import EngineClient, EngineResponse, PushedReads
from slotshift.clock import ManualClock
from slotshift.config import GatewayConfig
from tests.support import wait_until
from tests.unit.admission_gateway.conftest import StartGateway, auth, make_config

COMPLETION = {"model": "fake", "user": "A", "prompt": "Hi"}
ANSWER = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": []}).encode()
TIMEOUT_S = 10.0

Then = Literal["fin", "rst", "idle_close", "status_line", "headers", "stream_headers", "hang"]
"""What the server does to a request beyond `answered_per_connection` on a connection:
- fin, rst: close the connection as the request comes in, before reading it (the keep-alive race
  seen from the client: an idle close that crossed the request), with a FIN or a reset;
- idle_close: close a connection idle for `idle_close_s` (as uvicorn does after its keep-alive
  timeout), and set `idle_closed`;
- status_line, headers, stream_headers: read it, begin a response (a status line; the headers
  and part of a JSON body; the headers of an event stream) and drop the connection;
- hang: read it and never answer."""


@dataclass
class Engine:
    """Counts connections and the requests it read; `received` holds their bodies."""

    answered_per_connection: int = 1
    then: Then = "fin"
    answer_together: int = 1
    """Answers wait until this many requests are in (so that clients open that many connections)."""
    idle_close_s: float = 0.05
    idle_closed: threading.Event = field(default_factory=threading.Event)
    connections: int = 0
    received: list[bytes] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    """The Authorization header of each request read (None: it had none)."""
    port: int = 0
    _server: asyncio.Server | None = None
    _together: asyncio.Event = field(default_factory=asyncio.Event)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._stopping.set()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            for _ in range(self.answered_per_connection):
                if not await self._read_request(reader):
                    return
                if len(self.received) >= self.answer_together:
                    self._together.set()
                await self._together.wait()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
                    % (len(ANSWER), ANSWER)
                )
                await writer.drain()
            await self._misbehave(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _misbehave(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.then == "idle_close":
            try:
                async with asyncio.timeout(self.idle_close_s):
                    await reader.read(1)
            except TimeoutError:
                writer.close()
                await writer.wait_closed()
                self.idle_closed.set()
            return
        if self.then in ("fin", "rst"):
            # Waiting for the request's first bytes (and not counting them) puts the close
            # exactly where the race puts it: after the client took the connection from its pool.
            if not await reader.read(1):
                return
            if self.then == "rst":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            return
        if not await self._read_request(reader):
            return
        if self.then == "hang":
            await self._stopping.wait()
            return
        writer.write(
            {
                "status_line": b"HTTP/1.1 200 OK\r\n",
                "headers": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"id',
                "stream_headers": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n",
            }[self.then]
        )
        await writer.drain()

    async def _read_request(self, reader: asyncio.StreamReader) -> bool:
        """Read one request; False when the client closed the connection instead."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        length = 0
        authorization = None
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            if name.strip().lower() == b"authorization":
                authorization = value.strip().decode()
        self.authorizations.append(authorization)
        self.received.append(await reader.readexactly(length))
        return True


@pytest_asyncio.fixture
async def start_engine() -> AsyncIterator[Callable[..., Any]]:
    started: list[Engine] = []

    async def start(**settings: Any) -> Engine:
        engine = Engine(**settings)
        await engine.start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        await engine.stop()


@contextmanager
def engine_in_thread(**settings: Any) -> Iterator[Engine]:
    """An Engine on its own event loop in a thread, so that it acts while the test's loop is
    blocked."""
    engine = Engine(**settings)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="engine-loop", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(engine.start(), loop).result(timeout=5)
        yield engine
    finally:
        asyncio.run_coroutine_threadsafe(engine.stop(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


async def complete(
    http: aiohttp.ClientSession, url: str, prompt: str, *, stream: bool = False
) -> tuple[int, bytes]:
    body = {**COMPLETION, "prompt": prompt, "stream": stream}
    async with http.post(url + "/v1/completions", json=body, headers=auth("A")) as response:
        return response.status, await response.read()


def prompts(engine: Engine) -> list[str]:
    return [json.loads(body)["prompt"] for body in engine.received]


# --- through the gateway --------------------------------------------------------------------


@pytest.mark.parametrize("then", ["fin", "rst"])
async def test_a_request_on_a_pooled_connection_closed_under_it_is_sent_again_once(
    start_engine: Callable[..., Any],
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    then: Then,
) -> None:
    engine = await start_engine(then=then)
    gateway = await start_gateway(engine_url=engine.url)
    assert await complete(http, gateway.url, "first") == (200, ANSWER)
    assert await complete(http, gateway.url, "second") == (200, ANSWER)
    # The second went out on the first's pooled connection, which the engine closed unread; the
    # engine read it once, on a new connection.
    assert (prompts(engine), engine.connections) == (["first", "second"], 2)
    assert gateway.admission("A").in_flight == 0


@pytest.mark.parametrize(
    ("then", "expected"),
    [
        pytest.param("status_line", b'"upstream_unavailable"', id="status-line"),
        pytest.param("headers", b'"upstream_unavailable"', id="headers-and-part-of-the-body"),
        pytest.param("stream_headers", b'"upstream_unavailable"', id="stream-headers"),
    ],
)
async def test_a_request_whose_response_began_is_never_sent_again(
    start_engine: Callable[..., Any],
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    then: Then,
    expected: bytes,
) -> None:
    engine = await start_engine(then=then)
    gateway = await start_gateway(engine_url=engine.url)
    assert (await complete(http, gateway.url, "first"))[0] == 200
    status, body = await complete(http, gateway.url, "second", stream=then == "stream_headers")
    # A 502, or on a stream whose headers were relayed, an error event.
    assert status == (200 if then == "stream_headers" else 502)
    assert expected in body
    assert (prompts(engine), engine.connections) == (["first", "second"], 1)


async def test_a_request_on_a_fresh_connection_is_never_sent_again(
    start_engine: Callable[..., Any], start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    engine = await start_engine(answered_per_connection=0, then="fin")
    gateway = await start_gateway(engine_url=engine.url)
    status, body = await complete(http, gateway.url, "only")
    assert (status, b'"upstream_unavailable"' in body) == (502, True)
    assert engine.connections == 1


async def test_a_request_that_timed_out_is_never_sent_again(
    start_engine: Callable[..., Any], start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    engine = await start_engine(then="hang")
    # The wait for the timeout is the condition under test; it is short.
    gateway = await start_gateway(engine_url=engine.url, upstream_timeout_s=0.2)
    assert (await complete(http, gateway.url, "first"))[0] == 200
    status, body = await complete(http, gateway.url, "second")
    assert (status, b'"upstream_timeout"' in body) == (504, True)
    assert (prompts(engine), engine.connections) == (["first", "second"], 1)


@pytest.mark.parametrize(
    ("settings", "keepalive_s"),
    [
        pytest.param({}, 4.0, id="default-below-vllms-5s"),
        pytest.param({"upstream_keepalive_timeout_s": 1.5}, 1.5, id="configured"),
    ],
)
async def test_idle_pooled_connections_are_dropped_after_the_configured_time(
    start_engine: Callable[..., Any],
    http: aiohttp.ClientSession,
    settings: dict[str, Any],
    keepalive_s: float,
) -> None:
    # The gateway's clock dates its idle engine connections.
    clock = ManualClock()
    engine = await start_engine(answered_per_connection=100)
    gateway = AdmissionGateway(make_config(engine.url, **settings), gateway_id="gw", clock=clock)
    await gateway.start()
    try:
        assert (await complete(http, gateway.url, "1"))[0] == 200
        clock.advance(keepalive_s - 0.1)
        assert (await complete(http, gateway.url, "2"))[0] == 200
        assert engine.connections == 1
        clock.advance(keepalive_s + 0.1)
        assert (await complete(http, gateway.url, "3"))[0] == 200
        assert engine.connections == 2
    finally:
        await gateway.stop()


@pytest.mark.parametrize("value", [0, -1.0])
def test_the_keepalive_timeout_must_be_positive(value: float) -> None:
    with pytest.raises(ValidationError, match="upstream_keepalive_timeout_s"):
        GatewayConfig(upstream_keepalive_timeout_s=value)


# --- send on its own ------------------------------------------------------------------------


async def test_a_connection_the_engine_closed_while_idle_is_retried_on_a_new_one() -> None:
    # The race as it happens: the engine closes an idle pooled connection and the client takes
    # it before its event loop has seen the close (here because the loop is blocked, as a busy
    # gateway's is) and sends on it.
    with engine_in_thread(then="idle_close") as engine:
        async with EngineClient(engine_ssl=True, keepalive_timeout_s=60) as client:
            for prompt in ("a", "b", "c"):
                response = await client.send(
                    "POST",
                    engine.url,
                    data=json.dumps({"prompt": prompt}).encode(),
                    headers={},
                    timeout_s=TIMEOUT_S,
                )
                assert (response.status, await response.read()) == (200, ANSWER)
                response.release()
                # Blocks the loop on purpose (see above) until the engine closed the connection.
                assert engine.idle_closed.wait(timeout=5)
                engine.idle_closed.clear()
    # Each request after the first met a closed connection, and was read once, on a new one.
    assert (prompts(engine), engine.connections) == (["a", "b", "c"], 3)


async def _pool_two_connections(client: EngineClient, engine: Engine) -> None:
    async def one(prompt: str) -> None:
        response = await client.send(
            "POST",
            engine.url,
            data=json.dumps({"prompt": prompt}).encode(),
            headers={"Content-Type": "application/json"},
            timeout_s=TIMEOUT_S,
        )
        await response.read()
        response.release()

    await asyncio.gather(one("a"), one("b"))
    assert engine.connections == 2


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_when_every_pooled_connection_is_stale_the_retry_goes_out_on_a_new_one(
    start_engine: Callable[..., Any], method: str
) -> None:
    # A stale connection's siblings of its age are stale too: a retry on the next pooled one
    # would fail as well, so the retry opens a connection of its own (GET as POST: nothing is
    # retried on a pooled connection).
    engine = await start_engine(answer_together=2, then="fin")
    async with EngineClient(engine_ssl=True, keepalive_timeout_s=60) as client:
        await _pool_two_connections(client, engine)
        response = await client.send(
            method,
            engine.url,
            data=b'{"prompt": "c"}',
            headers={},
            timeout_s=TIMEOUT_S,
        )
        assert (response.status, await response.read()) == (200, ANSWER)
        response.release()
    # The newest pooled connection was tried (the engine read nothing on it), then a third.
    assert (prompts(engine), engine.connections) == (["a", "b", "c"], 3)


async def test_the_retry_on_a_new_connection_carries_the_engines_key_too(
    start_engine: Callable[..., Any],
) -> None:
    engine = await start_engine(answer_together=2, then="fin")
    key = SecretStr("engine-key-retry")
    async with EngineClient(engine_ssl=True, keepalive_timeout_s=60, api_key=key) as client:
        await _pool_two_connections(client, engine)
        response = await client.send(
            "POST",
            engine.url,
            data=b'{"prompt": "c"}',
            headers={"Authorization": "Bearer client-key"},
            timeout_s=TIMEOUT_S,
        )
        assert response.status == 200
        response.release()
    # The third request was read once, on the retry's own connection, with the engine's key.
    assert (prompts(engine), engine.connections) == (["a", "b", "c"], 3)
    assert engine.authorizations == ["Bearer engine-key-retry"] * 3


def test_the_engine_client_refuses_a_keepalive_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="keepalive_timeout_s"):
        EngineClient(engine_ssl=True, keepalive_timeout_s=0)


async def test_a_read_timeout_on_a_pooled_connection_is_never_retried(
    start_engine: Callable[..., Any],
) -> None:
    # The engine may be working on the request: a timeout is never a reason to send it again.
    engine = await start_engine(then="hang")
    async with EngineClient(engine_ssl=True, keepalive_timeout_s=60) as client:
        response = await client.send(
            "POST", engine.url, data=b'{"prompt": "a"}', headers={}, timeout_s=TIMEOUT_S
        )
        await response.read()
        response.release()
        with pytest.raises(TimeoutError):
            await client.send(
                "POST",
                engine.url,
                data=b'{"prompt": "b"}',
                headers={},
                # The wait for the timeout is the condition under test; it is short.
                timeout_s=0.2,
            )
    assert (prompts(engine), engine.connections) == (["a", "b"], 1)


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def streamed_from(serve: Serve) -> AsyncIterator[EngineResponse]:
    """A GET through an EngineClient to a raw server that answers with `serve`: the response
    once its headers are in, released afterwards."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with EngineClient(engine_ssl=True, keepalive_timeout_s=60) as client:
            response = await client.send(
                "GET", f"http://127.0.0.1:{port}/", data=None, headers={}, timeout_s=TIMEOUT_S
            )
            yield response
            response.release()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_stream_read_slower_than_it_comes_pauses_and_resumes_its_connection() -> None:
    # A stream that outruns its reader pauses its transport at the high-water mark and resumes
    # it as the reader catches up, to the last byte.
    chunk = b"data: " + b"x" * 1000 + b"\n\n"
    count = 4000
    written = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(count):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        writer.write(b"0\r\n\r\n")
        written.set()
        await writer.drain()
        writer.close()

    async with streamed_from(serve) as response:
        connection = response._connection
        first = await response.content.readany()
        await written.wait()
        await wait_until(lambda: connection._reading_paused, message="the transport paused")
        received = len(first)
        while data := await response.content.readany():
            received += len(data)
    assert received == count * len(chunk)


def _sse_chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


async def test_pushed_reads_are_taken_one_read_at_a_time_and_the_end_is_handed_back() -> None:
    # The engine sends its next event only once the last one was taken: every event reaches
    # `take` from the connection's read callback, in order, with no read by the task.
    events = [b"data: %d\n\n" % i for i in range(50)]
    taken: list[bytes] = []
    took = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(_STREAM_HEAD)
        for data in events:
            writer.write(_sse_chunk(data))
            await writer.drain()
            await took.wait()
            took.clear()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    def take(chunk: bytes) -> bool:
        taken.append(chunk)
        took.set()
        return True

    async with streamed_from(serve) as response:
        pushed = PushedReads.start(response, take)
        assert pushed is not None
        assert await asyncio.wait_for(pushed.handed_back, timeout=10) == b""
    assert taken == events


async def test_pushed_reads_started_on_a_paused_connection_keep_every_byte_in_order() -> None:
    # More than the reader's high-water mark buffered before the pushing starts: taking it
    # resumes the connection, and what comes after goes to `take` read by read.
    events = [b"data: %d %b\n\n" % (i, b"x" * 100) for i in range(12_000)]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(_STREAM_HEAD + b"".join(_sse_chunk(d) for d in events) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    taken: list[bytes] = []

    def take(chunk: bytes) -> bool:
        taken.append(chunk)
        return True

    async with streamed_from(serve) as response:
        connection = response._connection
        await wait_until(lambda: connection._reading_paused, message="the reader paused")
        pushed = PushedReads.start(response, take)
        assert pushed is not None
        last = await asyncio.wait_for(pushed.handed_back, timeout=10)
        assert last is not None
    assert b"".join(taken) + last == b"".join(events)
