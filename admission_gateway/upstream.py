"""The gateway's connections to the engine: one pooled session, a send that survives the
keep-alive race, and the engine's own credentials on every call.

`EngineClient.send` is the one way a gateway calls its engine (relayed requests, /v1/models,
the preemptible relay's /tokenize): it sets `Authorization` itself, to the engine's API key
(pools[].engine_api_key_file; vLLM's --api-key) or to nothing, so that whatever the caller
passes (and a client's own key above all) can never reach the engine. An engine's 401 is
therefore the gateway's misconfiguration, raised as EngineCredentialsRefused (the client gets a
502 and the log says which setting to fix), never relayed as if the client's key were wrong.

An HTTP server may close a keep-alive connection that has been idle for a while (vLLM's uvicorn
after `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s). If the gateway picks that connection from its pool
while the server's close is still on its way, the request meets a closed socket: a reset on
write or a disconnect before any byte of a response. The engine never read it, so failing it
would fail a request for nothing. Two defences:

- the pool forgets idle connections sooner than the engine closes them
  (`gateway.upstream_keepalive_timeout_s`), which closes the race in the common case (a gateway
  whose loop is busy relaying streams releases a connection late, so the margin can vanish);
- `send` sends again, once and on a connection of its own (never another pooled one: when one
  pooled connection was stale, the others of its age are too), a request whose *reused* pooled
  connection failed that way. Nothing else is retried (RFC 9112, 9.3.1: a request that may
  have been processed is not repeated): not a request that got any part of a response, not one
  on a fresh connection (the engine may have read it before it fell over), not a timeout. An
  engine that reads a request and then drops its reused connection without a byte of answer
  looks the same as a stale connection, so such a request reaches it twice; the first copy is
  aborted there, its connection being gone.

Which connection a request got is told by the pool's connector itself (`_PoolConnector`): a
connection it has handed out before is a reused one. (aiohttp's tracing signals tell it too,
but any trace config makes aiohttp build and fire every signal of every request: 8% of a
relayed request's instructions.)
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import weakref
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.tracing import Trace
from multidict import CIMultiDict
from pydantic import SecretStr

from admission_gateway.chunked import ChunkedFraming
from slotshift.config import reveal

logger = logging.getLogger(__name__)


class EngineCredentialsRefused(aiohttp.ClientError):
    """The engine answered 401: it requires an API key and the gateway sent none, or not one
    it takes. Callers fail the request as they fail an unreachable engine (502)."""


@dataclass
class _Attempt:
    """What one `session.request` call did, filled in by the pool's connector (`_PoolConnector`)."""

    reused: list[bool] = field(default_factory=list)
    """One entry per connection the call took, True where it came from the pool. aiohttp itself
    retries an idempotent method once, on a second connection (which may be pooled too)."""


_SENDING: ContextVar[_Attempt | None] = ContextVar("slotshift_engine_attempt", default=None)
"""The `send` in progress in this task, which its connector tells which connections it took
(a context variable: aiohttp gives the connector the request, not the caller's context)."""


class _EngineProtocol(ResponseHandler):
    """aiohttp's response protocol, less the work its stream reader asks of it after every read
    of a streamed answer: the reader calls `resume_reading` whenever its buffer runs low, paused
    or not, and each call feeds the HTTP parser an empty read and asks the transport to resume.
    With nothing paused there is nothing to resume (the parser holds no data back unless
    `pause_reading` paused it), and one relayed event costs about 3,500 instructions less."""

    on_read: Callable[[], None] | None = None
    """Called after each read has been parsed (the response's payload fed) and once the
    connection is lost; set by `PushedReads`."""
    take_framed: Callable[[bytes], bool] | None = None
    """Offered each read that is whole chunks of the response's body between two chunks
    (chunked.py), before the parser: True when it took the read, which the parser then never
    sees (it stays between the same two chunks, and a `sock_read` timeout, which the gateway
    never sets, would not be re-armed by it); set by `PushedReads`."""
    on_framed_error: Callable[[Exception], None] | None = None
    """Given what `take_framed` raised (the read counts as taken); set by `PushedReads`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.framing = ChunkedFraming()
        """Where the current response stands in its chunked framing (`take_framed`)."""

    def set_response_params(self, **params: Any) -> None:
        # aiohttp makes the response's parser here, before its first byte is read.
        self.framing.reset()
        super().set_response_params(**params)

    def resume_reading(self, resume_parser: bool = True) -> None:
        if self._reading_paused or self._buffer_paused:
            super().resume_reading(resume_parser)

    def data_received(self, data: bytes) -> None:
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
        super().data_received(data)
        on_read = self.on_read
        if on_read is not None:
            on_read()

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        on_read = self.on_read
        if on_read is not None:
            on_read()


class PushedReads:
    """A response's reads given to `take` from within the event loop's read callback of its
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
        response: aiohttp.ClientResponse,
        take: Callable[[bytes], bool],
        done: Callable[[], bool] | None,
    ) -> None:
        self._content = response.content
        self._take = take
        self._done = done
        self._protocol: _EngineProtocol | None = None
        self._taking = False
        self._again = False
        self.handed_back: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        """The bytes the task is to relay next (b"": the body ended), or None: nothing; read."""

    @classmethod
    def start(
        cls,
        response: aiohttp.ClientResponse,
        take: Callable[[bytes], bool],
        done: Callable[[], bool] | None = None,
        *,
        take_framed: Callable[[bytes], bool] | None = None,
    ) -> PushedReads | None:
        """Push `response`'s reads from now on (what is buffered first); None when it is not on
        an engine connection of this module's (the caller reads as usual)."""
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        if not isinstance(protocol, _EngineProtocol) or protocol.on_read is not None:
            return None
        pushed = cls(response, take, done)
        pushed._protocol = protocol
        protocol.on_read = pushed._after_read
        pushed._after_read()
        if take_framed is None:
            # Nobody will take a read of this response as it is framed: following its framing
            # would cost every read for nothing.
            protocol.framing.stop()
        elif pushed._protocol is not None:
            # Only once what the parser buffered is taken: a framed read goes out at once.
            protocol.take_framed = take_framed
            protocol.on_framed_error = pushed._failed
        return pushed

    async def wait(self, deadline_s: float) -> bytes | None:
        """What is handed back (`handed_back`), waited for until `deadline_s` (the loop's
        clock; TimeoutError after it): aiohttp applies a request's timeout only to the reads
        it is asked for."""
        async with asyncio.timeout_at(deadline_s):
            return await self.handed_back

    def stop(self) -> None:
        """No more pushing (call it on every way out: the connection may go back to the pool)."""
        protocol = self._protocol
        if protocol is not None:
            self._protocol = None
            if protocol.on_read == self._after_read:
                protocol.on_read = None
                protocol.take_framed = None
                protocol.on_framed_error = None

    def hand_back(self, chunk: bytes | None) -> None:
        """Stop, and wake the task with `chunk` (None: nothing to relay)."""
        self.stop()
        if not self.handed_back.done():
            self.handed_back.set_result(chunk)

    def _after_read(self) -> None:
        if self._protocol is None:
            return
        if self._taking:
            # Called again from within: taking the bytes can resume a paused connection, and
            # aiohttp then parses what it held back at once. The outer call takes that too.
            self._again = True
            return
        self._taking = True
        content = self._content
        try:
            # One pass a read (a loop, not a call: this runs for every relayed event).
            self._again = True
            while self._again and self._protocol is not None:
                self._again = False
                if content.exception() is not None:
                    self.hand_back(None)
                    return
                # What is buffered now: taking it may resume the connection and buffer more.
                chunk = content.read_nowait(-1)
                if content.at_eof() or (chunk and not self._take(chunk)):
                    self.hand_back(chunk)
                elif self._done is not None and self._done():
                    self.hand_back(None)
                elif content.is_eof():
                    self._again = True
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


def _engine_protocol(loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    return _EngineProtocol(loop=loop)


class _EngineConnector(aiohttp.TCPConnector):
    """A TCPConnector whose connections speak `_EngineProtocol`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # aiohttp builds every connection's protocol with this factory (aiohttp is pinned:
        # requirements/constraints.txt; a test checks that the engine's connections use it).
        self._factory = functools.partial(_engine_protocol, loop=self._loop)


class _PoolConnector(_EngineConnector):
    """A connector that notes, in the `_Attempt` of the `send` in progress, whether each
    connection it hands out is one it handed out before (a reused pooled connection)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature, passed by name)
    ) -> Connection:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is not None:
            attempt = _SENDING.get()
            if attempt is not None:
                attempt.reused.append(protocol in self._handed_out)
            self._handed_out.add(protocol)
        return connection


class EngineClient:
    """The gateway's HTTP client towards the engine: a pool of keep-alive connections whose idle
    ones are dropped after `keepalive_timeout_s` (keep it below the engine's own keep-alive
    timeout), with the tracing that `send` reads, and a session that opens a connection per
    request for `send`'s one retry. `engine_ssl`: how to check an https engine (True: the
    system's roots). `api_key`: the engine's API key, sent as `Authorization: Bearer KEY` on
    every call (None: no Authorization at all). Close it with `close` (or use it as an async
    context manager)."""

    def __init__(
        self,
        *,
        engine_ssl: ssl.SSLContext | bool,
        keepalive_timeout_s: float,
        api_key: SecretStr | None = None,
    ) -> None:
        if keepalive_timeout_s <= 0:
            raise ValueError(f"keepalive_timeout_s must be positive, not {keepalive_timeout_s}")
        self._pooled = _session(
            # The admission limits are the concurrency limit; aiohttp's default cap of 100
            # connections would silently queue requests the gateway has already admitted.
            _PoolConnector(limit=0, ssl=engine_ssl, keepalive_timeout=keepalive_timeout_s)
        )
        self._fresh = _session(_EngineConnector(limit=0, ssl=engine_ssl, force_close=True))
        self.on_unreachable: Callable[[], None] | None = None
        """Called whenever `send` finds the engine unreachable (no connection could be made),
        so that routing passes its pool over for a while (admission_gateway/routing.py)."""
        self._api_key = api_key

    async def close(self) -> None:
        await self._pooled.close()
        await self._fresh.close()

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
        client_timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """`method url` on a pooled connection, sent again once, on a new connection, when it
        went out on a reused pooled connection that failed on write or closed before any byte
        of a response (the engine never received it). `headers` go as they are, but for
        Authorization: any there is dropped, and the engine's API key set in its place when
        there is one. Returns the response once its status and headers have arrived; the caller
        reads, releases or closes it. Raises what `session.request` raises: TimeoutError on a
        timeout (never retried), aiohttp.ClientError on any other failure, of the retry where
        there was one; and EngineCredentialsRefused (an aiohttp.ClientError) when the engine
        answers 401."""
        sent = self._with_credentials(headers)
        try:
            response = await self._send(method, url, data, sent, client_timeout)
        except aiohttp.ClientConnectorError:
            if self.on_unreachable is not None:
                self.on_unreachable()
            raise
        if response.status == HTTPStatus.UNAUTHORIZED:
            # No client credential ever reaches the engine, so its 401 is about the gateway's
            # own key: a misconfiguration the client can do nothing about, not its answer.
            response.release()
            raise EngineCredentialsRefused(
                f"the engine refused {method} {url}: "
                + (
                    "the gateway's API key is not one it takes (pools[].engine_api_key_file)"
                    if self._api_key is not None
                    else "it requires an API key (set pools[].engine_api_key_file)"
                )
            )
        return response

    def _with_credentials(self, headers: Mapping[str, str]) -> CIMultiDict[str]:
        """`headers` with the engine's Authorization instead of any the caller put there."""
        sent = CIMultiDict(headers)
        sent.popall("Authorization", None)
        if self._api_key is not None:
            sent["Authorization"] = f"Bearer {reveal(self._api_key)}"
        return sent

    async def _send(
        self,
        method: str,
        url: str,
        data: bytes | None,
        headers: Mapping[str, str],
        client_timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        first = _Attempt()
        sending = _SENDING.set(first)
        try:
            return await self._pooled.request(
                method, url, data=data, headers=headers, timeout=client_timeout
            )
        except aiohttp.ClientError as exc:
            if not _never_received(exc, first):
                raise
            logger.info(
                "retrying %s %s on a new connection: its pooled connection to the engine was"
                " closed before any response (%r)",
                method,
                url,
                exc,
            )
        finally:
            _SENDING.reset(sending)
        return await self._fresh.request(
            method, url, data=data, headers=headers, timeout=client_timeout
        )


def _session(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        # Bodies pass through as the engine encoded them, and only the client's own headers
        # (not aiohttp's defaults) reach the engine.
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
        # A proxy keeps no cookies: one the engine (or a balancer in front of it) set in an
        # answer to one tenant would otherwise go with every later tenant's request.
        cookie_jar=aiohttp.DummyCookieJar(),
    )


_BODY_NOT_WRITTEN = "Can not write request body"
"""What aiohttp's ClientOSError says when the request body could not be sent
(aiohttp/client_reqrep.py, write_bytes)."""


def _never_received(exc: aiohttp.ClientError, attempt: _Attempt) -> bool:
    """Whether `exc` shows a stale pooled connection: the engine did not get the request."""
    if isinstance(exc, TimeoutError):
        # The engine may be working on it.
        return False
    if isinstance(exc, aiohttp.ClientOSError) and _BODY_NOT_WRITTEN in str(exc):
        # Whatever the connection: an engine that did not get the whole body cannot run it.
        return True
    if not attempt.reused or not all(attempt.reused):
        # A fresh connection: the engine may have read the request before it failed.
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # aiohttp puts the response message it had parsed (status line, headers) in place of
        # the text when a response had begun.
        return isinstance(exc.message, str)
    if isinstance(exc, aiohttp.ClientConnectorError):
        # Never raised for a pooled connection; listed so that a change in aiohttp fails safe.
        return False
    # A reset on write or read, or a write to a transport that was already closing.
    return isinstance(exc, aiohttp.ClientOSError | aiohttp.ClientConnectionResetError)
