"""The gateway's HTTP/1.1 server: asyncio protocols with llhttp as the parser (httptools, in C,
as uvicorn parses), the few routes the gateway serves, and responses written in as few writes as
they can be.

Why not aiohttp's server: its request and response objects, router, middleware chain and
writer cost a relayed request about a quarter of the gateway's CPU, and more of its latency
after an idle spell (a cold path is a long one): the least relay on aiohttp added 0.56-0.72 ms
to a first token where one on protocols added 0.18-0.23 (docs/results/gateway.md).

What it does: keep-alive (HTTP/1.1 by default, HTTP/1.0 on request), requests pipelined on one
connection answered in order, request bodies with a Content-Length or chunked (read as they
come, reading paused while a handler leaves more than a buffer's worth unread), `Expect:
100-continue`, TLS (the listener's), a cap on a request's head, an idle keep-alive timeout, and
a handler cancelled as soon as its client's connection is lost (which is how a relay learns to
abort the engine's work). A handler gets a `Request` and returns a `Response` (written whole,
with its Content-Length) or a `StreamResponse` it has written itself (chunked; to an HTTP/1.0
client, delimited by the connection's end). HEAD is answered as GET, without the body. What it does not: upgrades
(101), trailers, compression.

Errors as the gateway's clients read them: a route that does not exist is a 404, a method a
route does not take a 405 with Allow, in the OpenAI error shape (admission_gateway/errors.py);
an OpenAIError raised by a handler is its answer; anything else a 500 in the same shape, logged.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, cast

import httptools
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from admission_gateway.body_buffer import BodyBuffer

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES: Final = 64 * 1024
"""A request whose line and headers are longer is refused (431) and its connection closed."""
BODY_HIGH_WATER_BYTES: Final = 1 << 16
"""A connection stops reading while this much of a request's body waits for its handler."""
KEEPALIVE_TIMEOUT_S: Final = 75.0
"""An idle keep-alive connection is closed after this long (aiohttp's and nginx's default)."""

Handler = Callable[["Request"], Awaitable["StreamResponse"]]
ErrorResponse = Callable[[int, str, Mapping[str, str]], "Response"]
"""Makes the answer to a request the server refuses itself: status, message, extra headers."""


class HttpError(Exception):
    """An error a handler raises whose answer it knows (`response`)."""

    def response(self) -> Response:
        raise NotImplementedError


class Request:
    """One request as its handler sees it."""

    __slots__ = (
        "_connection",
        "content",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query_string",
        "version",
    )

    def __init__(
        self,
        connection: _Connection,
        method: str,
        path: str,
        query_string: str,
        headers: CIMultiDictProxy[str],
        version: str,
        content: BodyBuffer,
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.version = version
        """"1.1" or "1.0"."""
        self.content = content
        self.keep_alive = keep_alive
        """Whether the client keeps the connection for another request (HTTP/1.1 unless it
        says close; HTTP/1.0 only when it says keep-alive)."""
        self._connection = connection

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client connection's transport; None once it is lost."""
        return self._connection.transport

    async def read(self) -> bytes:
        return await self.content.read()


class StreamResponse:
    """A response its handler writes itself: `prepare`, then `write` parts of its body, then
    `write_eof`. Its head goes out with the first part (`send_headers_immediately` False, for
    a stream whose first event should not cost the client a wake-up of its own) or at
    `prepare`. The body is chunked, but to an HTTP/1.0 client: its end is then the
    connection's."""

    send_headers_immediately = True
    compression = False
    """Never compressed (a relay passes the engine's encoding through)."""

    def __init__(
        self, *, status: int = 200, headers: Mapping[str, str] | Iterable[tuple[str, str]] = ()
    ) -> None:
        self.status = status
        self.headers: CIMultiDict[str] = CIMultiDict(headers)
        self._connection: _Connection | None = None
        self._head: bytes | None = None
        """The head, not yet written (it goes with the first part)."""
        self._chunked = True
        self.prepared = False
        self.eof = False

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").partition(";")[0].strip()

    @content_type.setter
    def content_type(self, value: str) -> None:
        self.headers["Content-Type"] = value

    async def prepare(self, request: Request) -> None:
        """Ready to write to `request`'s client (its head goes out now or with the first
        part, see the class)."""
        if self.prepared:
            return
        connection = request._connection
        self._connection = connection
        self.prepared = True
        connection.started = True
        self._chunked = request.version != "1.0"
        headers = self.headers
        headers.popall("Content-Length", None)
        if self._chunked:
            headers["Transfer-Encoding"] = "chunked"
        else:
            headers.popall("Transfer-Encoding", None)
            connection.keep_alive = False
        self._head = connection.head(self.status, headers)
        if self.send_headers_immediately:
            head, self._head = self._head, None
            await connection.write(head)

    async def write(self, data: bytes) -> None:
        """One part of the body (b"" writes nothing); ConnectionResetError once the client is
        gone. Waits while the client's connection is over its high-water mark."""
        connection = self._connection
        if connection is None or self.eof:
            raise RuntimeError("write before prepare, or after write_eof")
        if not data and self._head is None:
            return
        out = (b"%x\r\n%b\r\n" % (len(data), data) if data else b"") if self._chunked else data
        if self._head is not None:
            out, self._head = self._head + out, None
        await connection.write(out)

    async def write_eof(self, data: bytes = b"") -> None:
        """The body's last part, and its end."""
        if self.eof:
            return
        connection = self._connection
        if connection is None:
            raise RuntimeError("write_eof before prepare")
        self.eof = True
        if self._chunked:
            out = (b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)) if data else b"0\r\n\r\n"
        else:
            out = data
        if self._head is not None:
            out, self._head = self._head + out, None
        if out:
            await connection.write(out)


class Response(StreamResponse):
    """A response whose body is known whole: the server writes it after its handler returns,
    head and body in one write, with its Content-Length."""

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        content_type: str | None = None,
    ) -> None:
        super().__init__(status=status, headers=headers)
        self.body = body
        if content_type is not None:
            self.content_type = content_type


def json_response(
    data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        status=status,
        body=orjson.dumps(data),
        headers=headers or {},
        content_type="application/json",
    )


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler


def get(path: str, handler: Handler) -> Route:
    return Route("GET", path, handler)


def post(path: str, handler: Handler) -> Route:
    return Route("POST", path, handler)


@functools.cache
def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    return b"HTTP/1.1 %d %s\r\n" % (status, reason.encode())


class _DateHeader:
    """The Date header's value (the wall clock's, as HTTP dates are), made once a second."""

    def __init__(self) -> None:
        self._second = 0
        self._value = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


class HttpServer:
    """Serves `routes` (at most one handler a method and path); `error_response` makes the
    answers the server gives itself (404, 405, 400, 431, 500)."""

    def __init__(self, routes: Iterable[Route], error_response: ErrorResponse) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}
        for route in routes:
            self._routes.setdefault(route.path, {})[route.method] = route.handler
        self.error_response = error_response
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self.dates = _DateHeader()

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Listen on `host`:`port` (0: a free one); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, ssl=ssl_context, reuse_address=True
        )
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    def handler_for(self, request: Request) -> Handler | Response:
        """The route's handler, or the server's own refusal."""
        methods = self._routes.get(request.path)
        if methods is None:
            return self.error_response(404, "Not Found", {})
        # HEAD is GET without the body (the server leaves it out: _send).
        handler = methods.get("GET" if request.method == "HEAD" else request.method)
        if handler is None:
            allow = ",".join(sorted(methods))
            return self.error_response(405, "Method Not Allowed", {"Allow": allow})
        return handler

    async def close(self, timeout_s: float) -> None:
        """Stop listening and close idle connections; give the handlers still running
        `timeout_s` to finish, then cancel them, and close every connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        busy = [c.task for c in self.connections if c.task is not None and not c.task.done()]
        if busy:
            _, pending = await asyncio.wait(busy, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=timeout_s)
        for connection in list(self.connections):
            connection.close()


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed by llhttp and handled one at a time, in order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._parsing: Request | None = None
        self._waiting: deque[Request] = deque()
        """Requests parsed while another is being answered (pipelined)."""
        self.task: asyncio.Task[None] | None = None
        """The task answering the current request."""
        self.keep_alive = True
        self.started = False
        """Whether the current request's answer has begun (a StreamResponse was prepared)."""
        self._closing = False
        self._reading_paused = False
        self._writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)
        self._idle()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "Upgrades are not supported.")
        except httptools.HttpParserError:
            self._refuse(400, "Bad Request")

    def eof_received(self) -> bool | None:
        return None  # close: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._server.connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        lost = ConnectionResetError("the client closed the connection")
        if self._parsing is not None:
            self._parsing.content.set_exception(lost)
        self._waiting.clear()
        task = self.task
        if task is not None and not task.done():
            # The client is gone: its handler stops (a relay aborts the engine's work).
            task.cancel()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(lost)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        drain = self._drain
        self._drain = None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # llhttp's callbacks (httptools calls only those a protocol has)

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("the request's head is too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        # UTF-8 with surrogates: a relayed header's bytes go on unchanged (upstream.py).
        self._headers.append(
            (name.decode("latin-1"), value.decode("utf-8", errors="surrogateescape"))
        )
        # Inline, not a call: this runs for every header of every request.
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("the request's head is too long")

    def on_headers_complete(self) -> None:
        parser = self._parser
        path, _, query = self._url.partition(b"?")
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        request = Request(
            self,
            parser.get_method().decode("ascii"),
            path.decode("utf-8", errors="surrogateescape"),
            query.decode("utf-8", errors="surrogateescape"),
            headers,
            parser.get_http_version(),
            BodyBuffer(self, high_water_bytes=BODY_HIGH_WATER_BYTES),
            parser.should_keep_alive(),
        )
        self._parsing = request
        if self.task is None:
            self._start(request)
        else:
            self._waiting.append(request)

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.content.feed(body)

    def on_message_complete(self) -> None:
        request = self._parsing
        self._parsing = None
        if request is not None:
            request.content.feed_eof()

    # writing

    def head(self, status: int, headers: CIMultiDict[str]) -> bytes:
        """A response's status line and headers, ending with the blank line."""
        lines = [_status_line(status)]
        lines += [
            b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("utf-8", errors="surrogateescape"))
            for k, v in headers.items()
        ]
        if "Date" not in headers:
            lines.append(b"Date: %s\r\n" % self._server.dates.date())
        if not self.keep_alive:
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def write(self, data: bytes) -> None:
        """Write `data` to the client, then wait while its connection is over its high-water
        mark; ConnectionResetError once the client is gone."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("cannot write to a closed client connection")
        transport.write(data)
        if self._writing_paused:
            drain = self._drain
            if drain is None:
                drain = self._drain = asyncio.get_running_loop().create_future()
            await drain

    # the server's own

    def _start(self, request: Request) -> None:
        if "100-continue" in request.headers.get("Expect", "").lower() and request.version != "1.0":
            transport = self.transport
            if transport is not None:
                transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.keep_alive = request.keep_alive
        self.started = False
        self.task = asyncio.get_running_loop().create_task(self._answer(request))

    async def _answer(self, request: Request) -> None:
        try:
            await self._send(request, await self._respond(request))
        except ConnectionResetError:
            self.close()
        except Exception:
            logger.exception("error answering %s %s", request.method, request.path)
            self.close()
        finally:
            self.task = None
        self._next()

    async def _respond(self, request: Request) -> StreamResponse:
        server = self._server
        handler = server.handler_for(request)
        if isinstance(handler, Response):
            return handler
        try:
            return await handler(request)
        except HttpError as error:
            return error.response()
        except ConnectionResetError:
            raise
        except Exception:
            logger.exception("error answering %s %s", request.method, request.path)
            return server.error_response(500, "Internal Server Error", {})

    async def _send(self, request: Request, response: StreamResponse) -> None:
        if not request.content.is_eof():
            # Answered before its body was all in (a refusal): what is left of the body would
            # be read as the next request.
            self.keep_alive = False
        if not response.prepared and self.started:
            # The handler began a streamed answer and then returned (or raised) another: the
            # client has part of the first, so the connection can carry nothing more.
            self.close()
            return
        if isinstance(response, Response) and not response.prepared:
            body = response.body
            headers = response.headers
            headers["Content-Length"] = str(len(body))
            headers.popall("Transfer-Encoding", None)
            head = self.head(response.status, headers)
            await self.write(head if request.method == "HEAD" else head + body)
        elif not response.prepared:
            await response.prepare(request)
            await response.write_eof()
        elif not response.eof:
            await response.write_eof()

    def _next(self) -> None:
        """The current request is answered: the next one, or the connection idles or ends."""
        if self.transport is None:
            return
        if not self.keep_alive or self._closing:
            self.close()
            return
        if self._waiting:
            self._start(self._waiting.popleft())
        else:
            self._idle()

    def _idle(self) -> None:
        if self._closing:
            self.close()
            return
        self._idle_timer = asyncio.get_running_loop().call_later(
            KEEPALIVE_TIMEOUT_S, self._idle_out
        )

    def _idle_out(self) -> None:
        if self.task is None and self._parsing is None:
            self.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request the parser could not read, and close (its framing is lost)."""
        transport = self.transport
        if transport is None:
            return
        if self.task is None:
            if self._head_bytes > MAX_HEAD_BYTES:
                status, message = 431, "Request Header Fields Too Large"
            response = self._server.error_response(status, message, {})
            self.keep_alive = False
            headers = response.headers
            headers["Content-Length"] = str(len(response.body))
            transport.write(self.head(response.status, headers) + response.body)
        self.close()

    def close_when_idle(self) -> None:
        """Close now if no request is being answered, else once it has been."""
        self._closing = True
        if self.task is None:
            self.close()

    def pause_reading(self) -> None:
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
