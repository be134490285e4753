"""The gateway's connections to the engine: HTTP/1.1 on asyncio protocols with llhttp as the
parser (httptools, in C, as uvicorn parses), a pool of keep-alive connections, a send that
survives the keep-alive race, and the engine's own credentials on every call.

Why not aiohttp's client: a relayed request spent about a third of the gateway's CPU in it
(its session, request and response objects, connector, timers and stream reader), and a
relayed event paid its stream reader on every read. Here a request is one write of bytes
built once, its answer's head is parsed in C, and a streamed answer's reads go to the relay
from the connection's read callback (`PushedReads`) without a task being woken.

`EngineClient.send` is the one way a gateway calls its engine (relayed requests, /v1/models,
the preemptible relay's /tokenize, the engine's prompt counts): it sets `Authorization` itself,
to the engine's API key (pools[].engine_api_key_file; vLLM's --api-key) or to nothing, so that
whatever the caller passes (and a client's own key above all) can never reach the engine. An
engine's 401 is therefore the gateway's misconfiguration, raised as EngineCredentialsRefused
(the client gets a 502 and the log says which setting to fix), never relayed as if the client's
key were wrong. Only what the caller passes goes to the engine (no User-Agent, no
Accept-Encoding, no cookies): bodies pass through as the engine encoded them.

An HTTP server may close a keep-alive connection that has been idle for a while (vLLM's uvicorn
after `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s). If the gateway picks that connection from its pool
while the server's close is still on its way, the request meets a closed socket: a reset, or a
close before any byte of a response. The engine never read it, so failing it would fail a
request for nothing. Two defences:

- the pool never hands out a connection idle longer than `keepalive_timeout_s`
  (`gateway.upstream_keepalive_timeout_s`), which closes the race in the common case (a gateway
  whose loop is busy relaying streams sees the engine's close late, so the margin can vanish);
- `send` sends again, once and on a connection of its own (never another pooled one: when one
  pooled connection was stale, the others of its age are too), a request whose *reused* pooled
  connection ended before any byte of a response. Nothing else is retried (RFC 9112, 9.3.1: a
  request that may have been processed is not repeated): not a request that got any part of a
  response, not one on a fresh connection (the engine may have read it before it fell over), not
  a timeout. An engine that reads a request and then drops its reused connection without a byte
  of answer looks the same as a stale connection, so such a request reaches it twice; the first
  copy is aborted there, its connection being gone.

What it does not do: HEAD (a HEAD answer's framing differs; the gateway sends none), request
bodies other than bytes, 1xx answers other than skipping them, HTTP/1.0 engines' keep-alive, and
decompression (none is asked for).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, cast
from urllib.parse import urlsplit

import httptools
import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import SecretStr

from admission_gateway.body_buffer import BodyBuffer
from admission_gateway.chunked import ChunkedFraming
from slotshift.clock import Clock, SystemClock
from slotshift.config import reveal

logger = logging.getLogger(__name__)

READ_HIGH_WATER_BYTES: Final = 1 << 17
"""A connection stops reading once this much of its answer's body waits to be read (and reads
again once it has been): an engine that outruns its reader is held back by TCP, not buffered."""

_NOT_SENT: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})
"""Request headers a caller may pass that `send` writes itself (or, for the framing ones, that
must not contradict what it writes); Authorization is the engine key's (see the docstring)."""


class EngineError(Exception):
    """The engine could not be asked, or did not answer as HTTP: callers fail the request as
    they fail an unreachable engine (502)."""


class EngineUnreachable(EngineError):
    """No connection to the engine could be made."""


class EngineDisconnected(EngineError):
    """The connection ended before the answer was whole."""

    def __init__(self, message: str, *, answer_began: bool) -> None:
        super().__init__(message)
        self.answer_began = answer_began
        """Whether any byte of an answer had arrived (then the engine read the request)."""


class EngineProtocolError(EngineError):
    """The engine's answer is not HTTP/1.1 this client reads."""


class EngineCredentialsRefused(EngineError):
    """The engine answered 401: it requires an API key and the gateway sent none, or not one
    it takes. Callers fail the request as they fail an unreachable engine (502)."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a URL's requests go."""

    key: tuple[str, str, int]
    """The pool's key: scheme, host, port."""
    host_header: str
    path: str
    """The request target: path and query."""


class EngineResponse:
    """An answer of the engine whose status and headers have arrived. Read its body (`read`,
    `content.readany`, or `PushedReads`), then `release` it (its connection goes back to the
    pool when the answer was whole) or `close` it (the engine sees the connection end: an
    unfinished request is aborted there)."""

    __slots__ = ("_connection", "content", "content_type", "headers", "status")

    def __init__(
        self,
        connection: _EngineConnection,
        status: int,
        headers: CIMultiDictProxy[str],
        deadline_s: float,
    ) -> None:
        self.status = status
        self.headers = headers
        content_type = headers.get("Content-Type", "")
        self.content_type = content_type.partition(";")[0].strip().lower()
        """The media type (no parameters, lower case), "" when there is none."""
        self.content = BodyBuffer(
            connection, high_water_bytes=READ_HIGH_WATER_BYTES, deadline_s=deadline_s
        )
        self._connection = connection

    async def read(self) -> bytes:
        """The whole body."""
        return await self.content.read()

    async def json(self) -> Any:
        """The whole body as JSON (ValueError when it is not)."""
        return orjson.loads(await self.read())

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool if the answer was whole
        and the engine keeps the connection open, else it is closed."""
        self._connection.finished(self)

    def close(self) -> None:
        """Close the connection now, whatever remains of the answer (nothing once released:
        the connection may carry another answer by then)."""
        connection = self._connection
        if connection._response is self:
            connection.close()

    async def __aenter__(self) -> EngineResponse:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()


class _EngineConnection(asyncio.Protocol):
    """One connection to the engine: one request at a time, its answer parsed by llhttp."""

    on_read: Callable[[], None] | None = None
    """Called after each read has been parsed (its body fed) and once the connection is lost;
    set by `PushedReads`."""
    take_framed: Callable[[bytes], bool] | None = None
    """Offered each read that is whole chunks of the answer's body between two chunks
    (chunked.py), before the parser: True when it took the read, which the parser then never
    sees (it stays between the same two chunks); set by `PushedReads`."""
    on_framed_error: Callable[[Exception], None] | None = None
    """Given what `take_framed` raised (the read counts as taken); set by `PushedReads`."""

    def __init__(self, pool: _Pool, key: tuple[str, str, int]) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.framing = ChunkedFraming()
        """Where the current answer stands in its chunked framing (`take_framed`)."""
        self.idle_since_s = 0.0
        self._head: asyncio.Future[EngineResponse] | None = None
        self._deadline_s = 0.0
        self._response: EngineResponse | None = None
        self._headers: list[tuple[str, str]] = []
        self._received = False
        self._informational = False
        self._until_close = False
        self._complete = False
        self._keep_alive = False
        self._reading_paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._received = True
        framing = self.framing
        if framing.following and framing.whole_chunks(data):
            take_framed = self.take_framed
            if take_framed is not None:
                # Raised out of here, the error would make the loop close the connection:
                # the task gets it instead (a try costs nothing until something is raised).
                try:
                    if take_framed(data):
                        return
                except Exception as exc:
                    on_error = self.on_framed_error
                    if on_error is None:
                        raise
                    on_error(exc)
                    return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineProtocolError(f"the engine's answer is not HTTP/1.1: {exc}"))
            self.close()
        on_read = self.on_read
        if on_read is not None:
            on_read()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._pool.forget(self)
        response = self._response
        if response is not None and not self._complete and self._until_close and exc is None:
            # An answer without framing of its own ends with its connection.
            self._complete = True
            response.content.feed_eof()
        elif not self._complete:
            reason = f" ({exc})" if exc is not None else ""
            self._fail(
                EngineDisconnected(
                    "the engine closed the connection before its answer was whole" + reason,
                    answer_began=self._received,
                )
            )
        on_read = self.on_read
        if on_read is not None:
            on_read()

    # llhttp's callbacks (httptools calls only those a protocol has)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append(
            (name.decode("latin-1"), value.decode("utf-8", errors="surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if status < 200:
            # 100 Continue and the like: the final answer follows.
            self._informational = True
            self._headers = []
            return
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        self._keep_alive = parser.should_keep_alive()
        self._until_close = (
            "Content-Length" not in headers
            and "Transfer-Encoding" not in headers
            and status not in (204, 304)
        )
        if self._until_close:
            self._keep_alive = False
        self._response = response = EngineResponse(self, status, headers, self._deadline_s)
        head = self._head
        self._head = None
        if head is not None and not head.done():
            head.set_result(response)

    def on_body(self, body: bytes) -> None:
        response = self._response
        if response is not None:
            response.content.feed(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._complete = True
        response = self._response
        if response is not None:
            response.content.feed_eof()

    # the client's own

    def send(self, request: bytes, deadline_s: float) -> asyncio.Future[EngineResponse]:
        """Write `request` (its head and body); the future is the answer once its head has
        been parsed."""
        transport = self.transport
        head = asyncio.get_running_loop().create_future()
        if transport is None or transport.is_closing():
            head.set_exception(
                EngineDisconnected("the connection was closed before sending", answer_began=False)
            )
            return head
        self._head = head
        self._deadline_s = deadline_s
        self._response = None
        self._headers = []
        self._received = False
        self._informational = False
        self._until_close = False
        self._complete = False
        self._keep_alive = False
        self.framing.reset()
        transport.write(request)
        return head

    def finished(self, response: EngineResponse) -> None:
        """`response` is done with: back to the pool if it was whole and the connection may
        carry another, else closed."""
        if response is not self._response:
            return
        self._response = None
        self.on_read = self.take_framed = self.on_framed_error = None
        self.resume_reading()
        # A connection that is lost has no transport.
        if self._complete and self._keep_alive and self.transport is not None:
            self._pool.give_back(self)
        else:
            self.close()

    def pause_reading(self) -> None:
        transport = self.transport
        if transport is not None and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()

    def resume_reading(self) -> None:
        transport = self.transport
        if transport is not None and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def close(self) -> None:
        transport = self.transport
        if transport is not None:
            transport.close()

    def _fail(self, exc: EngineError) -> None:
        head = self._head
        self._head = None
        if head is not None and not head.done():
            head.set_exception(exc)
        response = self._response
        if response is not None and response.content.exception() is None:
            response.content.set_exception(exc)


def _time_out(head: asyncio.Future[EngineResponse]) -> None:
    if not head.done():
        head.set_exception(TimeoutError("no answer from the engine in time"))


class _Pool:
    """Idle keep-alive connections by where they go, newest last; the connections in use."""

    def __init__(self, clock: Clock, keepalive_timeout_s: float) -> None:
        self._clock = clock
        self._keepalive_timeout_s = keepalive_timeout_s
        self._idle: dict[tuple[str, str, int], list[_EngineConnection]] = {}
        self.open: set[_EngineConnection] = set()

    def take(self, key: tuple[str, str, int]) -> _EngineConnection | None:
        """The most recently used idle connection to `key` that may still be used; those idle
        for longer than the keep-alive timeout are closed."""
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_s = self._clock.monotonic() - self._keepalive_timeout_s
        while idle:
            connection = idle.pop()
            transport = connection.transport
            fresh = connection.idle_since_s >= oldest_s
            if fresh and transport is not None and not transport.is_closing():
                return connection
            connection.close()
        return None

    def give_back(self, connection: _EngineConnection) -> None:
        connection.idle_since_s = self._clock.monotonic()
        self._idle.setdefault(connection.key, []).append(connection)

    def forget(self, connection: _EngineConnection) -> None:
        self.open.discard(connection)
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    def close(self) -> None:
        for connection in list(self.open):
            connection.close()
        self._idle.clear()


class PushedReads:
    """An answer's reads given to `take` from within the event loop's read callback of its
    engine connection, after each read has been parsed: a relay that writes what it takes to
    its client at once costs no wake-up of its task, no future and no coroutine resumed a
    read, the most of a relayed event's own CPU. The task waits on `handed_back` meanwhile,
    and reads the rest itself (`content.readany()`) once it is woken.

    `take(chunk)` gets each read's bytes (never b""): True when it took them, False to hand
    them back to the task unread; it must not wait. `take_framed(read)`, if given, is offered
    first each read that is whole chunks of the body, as the engine framed them (chunk size
    lines included): True when it took the read (the parser never sees it), False to have it
    parsed and given to `take` as usual; it must not wait either, and what it raises is raised
    by `handed_back`, as for `take`; it must not take a read after which `done()` would hold
    (only `take` is followed by that question). Once `done()` (if given) holds after a take, the
    pushing ends with nothing handed back (None). What is not a read is handed back at once:
    the body's end (its last bytes, b"" for none, as `readany` gives them), a failed read (None:
    the task's `readany` raises the failure), an error `take` raised (raised by
    `handed_back`)."""

    def __init__(
        self,
        response: EngineResponse,
        take: Callable[[bytes], bool],
        done: Callable[[], bool] | None,
    ) -> None:
        self._content = response.content
        self._take = take
        self._done = done
        self._connection: _EngineConnection | None = None
        self._taking = False
        self.handed_back: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        """The bytes the task is to relay next (b"": the body ended), or None: nothing; read."""

    @classmethod
    def start(
        cls,
        response: EngineResponse,
        take: Callable[[bytes], bool],
        done: Callable[[], bool] | None = None,
        *,
        take_framed: Callable[[bytes], bool] | None = None,
    ) -> PushedReads | None:
        """Push `response`'s reads from now on (what is buffered first); None when its reads
        are pushed already (the caller reads as usual)."""
        connection = response._connection
        if connection.on_read is not None or connection._response is not response:
            return None
        pushed = cls(response, take, done)
        pushed._connection = connection
        connection.on_read = pushed._after_read
        pushed._after_read()
        if take_framed is None:
            # Nobody will take a read of this answer as it is framed: following its framing
            # would cost every read for nothing.
            connection.framing.stop()
        elif pushed._connection is not None:
            # Only once what the parser buffered is taken: a framed read goes out at once.
            connection.take_framed = take_framed
            connection.on_framed_error = pushed._failed
        return pushed

    async def wait(self, deadline_s: float) -> bytes | None:
        """What is handed back (`handed_back`), waited for until `deadline_s` (the loop's
        clock; TimeoutError after it)."""
        async with asyncio.timeout_at(deadline_s):
            return await self.handed_back

    def stop(self) -> None:
        """No more pushing (call it on every way out: the connection may go back to the pool)."""
        connection = self._connection
        if connection is not None:
            self._connection = None
            if connection.on_read == self._after_read:
                connection.on_read = None
                connection.take_framed = None
                connection.on_framed_error = None

    def hand_back(self, chunk: bytes | None) -> None:
        """Stop, and wake the task with `chunk` (None: nothing to relay)."""
        self.stop()
        if not self.handed_back.done():
            self.handed_back.set_result(chunk)

    def _after_read(self) -> None:
        if self._connection is None or self._taking:
            return
        self._taking = True
        content = self._content
        try:
            if content.exception() is not None:
                self.hand_back(None)
                return
            chunk = content.read_nowait()
            if content.is_eof() or (chunk and not self._take(chunk)):
                self.hand_back(chunk)
            elif self._done is not None and self._done():
                self.hand_back(None)
        except Exception as exc:
            # Raised again in the task: raised here, the loop would close the connection.
            self._failed(exc)
        finally:
            self._taking = False

    def _failed(self, exc: Exception) -> None:
        """Stop, and raise `exc` in the task."""
        self.stop()
        if not self.handed_back.done():
            self.handed_back.set_exception(exc)


class EngineClient:
    """The gateway's HTTP client towards the engine: a pool of keep-alive connections whose idle
    ones are not used after `keepalive_timeout_s` (keep it below the engine's own keep-alive
    timeout), and `send`'s one retry on a connection of its own. `engine_ssl`: how to check an
    https engine (True: the system's roots; False: not at all). `api_key`: the engine's API key,
    sent as `Authorization: Bearer KEY` on every call (None: no Authorization at all). `clock`
    dates idle connections. Close it with `close` (or use it as an async context manager)."""

    def __init__(
        self,
        *,
        engine_ssl: ssl.SSLContext | bool,
        keepalive_timeout_s: float,
        api_key: SecretStr | None = None,
        clock: Clock | None = None,
    ) -> None:
        if keepalive_timeout_s <= 0:
            raise ValueError(f"keepalive_timeout_s must be positive, not {keepalive_timeout_s}")
        self._pool = _Pool(clock if clock is not None else SystemClock(), keepalive_timeout_s)
        self._engine_ssl = engine_ssl
        self._ssl_context: ssl.SSLContext | None = None
        self._targets: dict[str, _Target] = {}
        self.on_unreachable: Callable[[], None] | None = None
        """Called whenever `send` finds the engine unreachable (no connection could be made),
        so that routing passes its pool over for a while (admission_gateway/routing.py)."""
        self._authorization = (
            b"" if api_key is None else b"Authorization: Bearer %s\r\n" % reveal(api_key).encode()
        )
        self._has_key = api_key is not None

    async def close(self) -> None:
        self._pool.close()

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def send(
        self,
        method: str,
        url: str,
        *,
        data: bytes | None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> EngineResponse:
        """`method url` on a pooled connection, sent again once, on a new connection, when it
        went out on a reused pooled connection that ended before any byte of an answer (the
        engine never received it). `headers` go as they are, but for Authorization (the
        engine's API key instead, when there is one) and the ones `send` writes itself (Host,
        Content-Length; Transfer-Encoding and Connection are dropped). Returns the answer once
        its status and headers have arrived; the caller reads it and releases or closes it.
        `timeout_s` bounds the whole exchange, the body's reads included. Raises TimeoutError
        past it (never retried), EngineUnreachable when no connection could be made,
        EngineDisconnected or EngineProtocolError for a connection that failed (of the retry
        where there was one), EngineCredentialsRefused when the engine answers 401."""
        target = self._target(url)
        request = self._request(method, target, headers, data)
        deadline_s = asyncio.get_running_loop().time() + timeout_s
        response = await self._exchange(target, request, deadline_s, method, url)
        if response.status == HTTPStatus.UNAUTHORIZED:
            # No client credential ever reaches the engine, so its 401 is about the gateway's
            # own key: a misconfiguration the client can do nothing about, not its answer.
            response.close()
            raise EngineCredentialsRefused(
                f"the engine refused {method} {url}: "
                + (
                    "the gateway's API key is not one it takes (pools[].engine_api_key_file)"
                    if self._has_key
                    else "it requires an API key (set pools[].engine_api_key_file)"
                )
            )
        return response

    async def ask_json(
        self, url: str, query: Mapping[str, Any], *, headers: Mapping[str, str], timeout_s: float
    ) -> Any:
        """POST `query` as JSON to `url`, one of the engine's side endpoints (/tokenize), and
        return its answer's JSON. Raises what `send` raises, and ValueError for a status other
        than 200 or a body that is not JSON."""
        response = await self.send(
            "POST",
            url,
            data=orjson.dumps(query),
            headers={"Content-Type": "application/json", **headers},
            timeout_s=timeout_s,
        )
        async with response:
            if response.status != HTTPStatus.OK:
                raise ValueError(f"status {response.status}")
            return await response.json()

    async def _exchange(
        self, target: _Target, request: bytes, deadline_s: float, method: str, url: str
    ) -> EngineResponse:
        pooled = self._pool.take(target.key)
        if pooled is not None:
            try:
                return await self._answer(pooled, request, deadline_s)
            except EngineDisconnected as exc:
                if exc.answer_began:
                    raise
                logger.info(
                    "retrying %s %s on a new connection: its pooled connection to the engine was"
                    " closed before any answer (%s)",
                    method,
                    url,
                    exc,
                )
        async with asyncio.timeout_at(deadline_s):
            connection = await self._connect(target)
        return await self._answer(connection, request, deadline_s)

    async def _answer(
        self, connection: _EngineConnection, request: bytes, deadline_s: float
    ) -> EngineResponse:
        head = connection.send(request, deadline_s)
        # A timer on the head itself: asyncio.timeout's cancellation and its bookkeeping would
        # cost every request more than the wait.
        timer = asyncio.get_running_loop().call_at(deadline_s, _time_out, head)
        try:
            return await head
        except BaseException:
            # A timeout or a cancelled caller: the connection's end is how the engine learns
            # that nobody waits for the answer any more.
            connection.close()
            raise
        finally:
            timer.cancel()

    async def _connect(self, target: _Target) -> _EngineConnection:
        scheme, host, port = target.key
        pool = self._pool
        try:
            _, connection = await asyncio.get_running_loop().create_connection(
                lambda: _EngineConnection(pool, target.key),
                host,
                port,
                ssl=self._ssl() if scheme == "https" else None,
            )
        except OSError as exc:
            if self.on_unreachable is not None:
                self.on_unreachable()
            raise EngineUnreachable(
                f"cannot connect to the engine at {host}:{port}: {exc}"
            ) from exc
        pool.open.add(connection)
        return connection

    def _ssl(self) -> ssl.SSLContext:
        context = self._ssl_context
        if context is None:
            engine_ssl = self._engine_ssl
            if isinstance(engine_ssl, ssl.SSLContext):
                context = engine_ssl
            else:
                context = ssl.create_default_context()
                if not engine_ssl:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
            self._ssl_context = context
        return context

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {url!r}")
            default = 443 if parts.scheme == "https" else 80
            port = parts.port or default
            host = parts.hostname
            shown = f"[{host}]" if ":" in host else host
            target = _Target(
                key=(parts.scheme, host, port),
                host_header=shown if port == default else f"{shown}:{port}",
                path=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            )
            # The gateway calls a handful of URLs (its engines' routes): kept for good.
            if len(self._targets) < 64:
                self._targets[url] = target
        return target

    def _request(
        self, method: str, target: _Target, headers: Mapping[str, str], data: bytes | None
    ) -> bytes:
        if method == "HEAD":
            raise ValueError("HEAD is not sent to the engine")
        lines = [f"{method} {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n"]
        for name, value in headers.items():
            lowered = name.lower()
            if lowered in _NOT_SENT or lowered == "authorization":
                continue
            lines.append(f"{name}: {value}\r\n")
        text = "".join(lines)
        # A line break or NUL inside a name or value would let a caller's header write
        # another header (or request) of its own.
        # (The first line holds two line ends: the request line's and Host's.)
        breaks = len(lines) + 1
        if text.count("\n") != breaks or text.count("\r") != breaks or "\0" in text:
            raise ValueError("a request header holds a line break or NUL")
        body = b"" if data is None else data
        length = (
            b"Content-Length: %d\r\n" % len(body) if data is not None or method != "GET" else b""
        )
        return b"".join(
            (
                text.encode("utf-8", errors="surrogateescape"),
                self._authorization,
                length,
                b"\r\n",
                body,
            )
        )
