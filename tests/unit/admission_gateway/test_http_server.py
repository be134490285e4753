"""The gateway's HTTP server on real sockets: keep-alive and pipelining, bodies, its own
refusals, streams, a lost client cancelling its handler, and shutdown.

Requests are written as raw bytes (what a client sends is exact) and answers read with a small
HTTP/1.1 reader, so that framing is checked byte for byte.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from admission_gateway.errors import OpenAIError, server_error
from admission_gateway.http_server import (
    MAX_HEAD_BYTES,
    HttpServer,
    Request,
    Response,
    StreamResponse,
    get,
    json_response,
    post,
)
from tests.support import wait_until

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class Handlers:
    """The routes under test, and what they saw."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()

    async def echo(self, request: Request) -> StreamResponse:
        body = await request.read()
        self.bodies.append(body)
        return json_response({"path": request.path, "query": request.query_string, "n": len(body)})

    async def stream(self, request: Request) -> StreamResponse:
        response = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(3):
            await response.write(b"data: %d\n\n" % index)
        await response.write_eof(b"data: [DONE]\n\n")
        return response

    async def hang(self, request: Request) -> StreamResponse:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Response(body=b"released")

    async def refuse(self, request: Request) -> StreamResponse:
        raise OpenAIError(413, "too large", error_type="invalid_request_error", code="too_large")

    async def fail(self, request: Request) -> StreamResponse:
        raise RuntimeError("a bug")

    def routes(self) -> list[Any]:
        return [
            post("/echo", self.echo),
            get("/echo", self.echo),
            post("/stream", self.stream),
            post("/hang", self.hang),
            post("/refuse", self.refuse),
            get("/fail", self.fail),
        ]


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[HttpServer, Handlers, Connect]]:
    handlers = Handlers()
    server = HttpServer(handlers.routes(), server_error)
    port = await server.start("127.0.0.1", 0, None)
    writers: list[asyncio.StreamWriter] = []

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        return reader, writer

    try:
        yield server, handlers, connect
    finally:
        for writer in writers:
            writer.close()
        handlers.release.set()
        await server.close(1.0)


async def read_answer(reader: asyncio.StreamReader, *, head_only: bool = False) -> Answer:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = b""
    if head_only:
        pass
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int(await reader.readuntil(b"\r\n"), 16)
            body += (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                break
    else:
        body = await reader.read()
    return Answer(int(status_line.split()[1]), headers, body)


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    method: str, path: str, body: bytes = b"", *, version: str = "1.1", extra: str = ""
) -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    return f"{method} {path} HTTP/{version}\r\nHost: t\r\n{extra}{length}\r\n".encode() + body


async def test_requests_on_one_connection_pipelined_are_answered_in_order() -> None:
    async with serving() as (_, handlers, connect):
        reader, writer = await connect()
        writer.write(request("POST", "/echo?a=1", b"one") + request("POST", "/echo", b"second"))
        first, second = await read_answer(reader), await read_answer(reader)
        assert (first.status, first.json()) == (200, {"path": "/echo", "query": "a=1", "n": 3})
        assert second.json()["n"] == 6
        assert first.headers["content-type"] == "application/json"
        assert "date" in first.headers
        writer.write(request("GET", "/echo"))
        assert (await read_answer(reader)).json()["n"] == 0
    assert handlers.bodies == [b"one", b"second", b""]


async def test_a_chunked_request_body_is_read_whole() -> None:
    async with serving() as (_, handlers, connect):
        reader, writer = await connect()
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        assert (await read_answer(reader)).json()["n"] == 5
    assert handlers.bodies == [b"abcde"]


async def test_expect_continue_is_answered_before_the_body_is_sent() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"ok")
        assert (await read_answer(reader)).json()["n"] == 2


async def test_the_servers_own_refusals_take_the_openai_error_shape() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(request("GET", "/nowhere"))
        missing = await read_answer(reader)
        assert (missing.status, missing.json()["error"]["type"]) == (404, "not_found_error")
        writer.write(request("DELETE", "/echo"))
        wrong = await read_answer(reader)
        assert wrong.status == 405 and wrong.headers["allow"] == "GET,POST"
        writer.write(request("GET", "/fail"))
        failed = await read_answer(reader)
        assert (failed.status, failed.json()["error"]["type"]) == (500, "server_error")
        # None of them ended the connection.
        writer.write(request("POST", "/echo", b"x"))
        assert (await read_answer(reader)).status == 200


async def test_head_is_answered_as_get_without_a_body() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(request("HEAD", "/echo") + request("GET", "/echo"))
        head = await read_answer(reader, head_only=True)
        assert head.status == 200 and int(head.headers["content-length"]) > 0
        # The next answer follows the head at once: no body was sent for HEAD.
        assert (await read_answer(reader)).json()["n"] == 0


async def test_a_refusal_before_the_body_came_closes_the_connection() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(b"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc")
        refused = await read_answer(reader)
        assert (refused.status, refused.json()["error"]["code"]) == (413, "too_large")
        assert refused.headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""


async def test_a_stream_is_chunked_to_http_1_1_and_delimited_by_the_close_to_1_0() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(request("POST", "/stream"))
        streamed = await read_answer(reader)
        assert streamed.headers["transfer-encoding"] == "chunked"
        assert streamed.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        old_reader, old_writer = await connect()
        old_writer.write(request("POST", "/stream", version="1.0"))
        old = await read_answer(old_reader)
        assert "transfer-encoding" not in old.headers and old.headers["connection"] == "close"
        assert old.body == streamed.body


async def test_an_http_1_0_client_without_keep_alive_gets_its_connection_closed() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(request("POST", "/echo", b"a", version="1.0"))
        assert (await read_answer(reader)).headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""


async def test_a_client_that_goes_away_cancels_its_handler() -> None:
    async with serving() as (server, handlers, connect):
        _, writer = await connect()
        writer.write(request("POST", "/hang", b"x"))
        await asyncio.wait_for(handlers.started.wait(), timeout=10)
        writer.close()
        await asyncio.wait_for(handlers.cancelled.wait(), timeout=10)
        await wait_until(lambda: not server.connections, message="the connection is gone")


async def test_a_head_too_long_is_refused_and_the_connection_closed() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(request("GET", "/echo", extra=f"X-Big: {'a' * MAX_HEAD_BYTES}\r\n"))
        assert (await read_answer(reader)).status == 431
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""


async def test_garbage_is_a_400_and_the_connection_closed() -> None:
    async with serving() as (_, _handlers, connect):
        reader, writer = await connect()
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        assert (await read_answer(reader)).status == 400
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""


@pytest.mark.parametrize("finishes", [True, False])
async def test_close_lets_a_running_handler_finish_or_cancels_it(finishes: bool) -> None:
    async with serving() as (server, handlers, connect):
        idle_reader, _ = await connect()
        reader, writer = await connect()
        writer.write(request("POST", "/hang", b"x"))
        await asyncio.wait_for(handlers.started.wait(), timeout=10)
        if finishes:
            asyncio.get_running_loop().call_soon(handlers.release.set)
        await server.close(0.5 if finishes else 0.05)
        # The idle connection was closed at once.
        assert await asyncio.wait_for(idle_reader.read(), timeout=10) == b""
        if finishes:
            answer = await read_answer(reader)
            assert (answer.status, answer.body) == (200, b"released")
        else:
            assert handlers.cancelled.is_set()
