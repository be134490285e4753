"""The nearest step below aiohttp: an HTTP/1.1 relay on asyncio protocols and llhttp (httptools),
measured beside the gateway.

    python -m slotshift_tools.gateway_bench.protocol_relay --port 9000 --upstream-port 8000 \\
        --tenant-key interactive=KEY [--tenant-key NAME=KEY ...]

What a gateway's data path would be without aiohttp's server and client. Each client connection
is an asyncio.Protocol whose bytes go to llhttp's request parser (httptools, in C, as uvicorn
parses); a request is read whole (method, target, headers, a Content-Length or chunked body), its
tenant picked by its `Authorization: Bearer KEY` (a dict lookup, as the gateway's; a missing or
unknown key is answered 401 on the same connection) and counted in flight per tenant (where a
gateway's admission would decide), and it is sent on over a pooled keep-alive connection to the
upstream (an idle one, else a new one: no limit), less the hop-by-hop headers and the client's
key, with Host and Content-Length written anew. The answer's head is parsed and written anew less
its hop-by-hop headers; its body goes to the client as each read of it arrives, the same bytes (an
event stream keeps the upstream's chunks), while llhttp reads the same bytes only to find where
the answer ends, so that both connections carry the next request: nothing reads an event's
contents. A read of a stream costs a parser feed (C, no Python callback) and one write; a request
on a pooled upstream connection no task, future or await.

Client connections are kept alive (HTTP/1.1 only: 505 for another version); requests a client
pipelines are answered in order. Back-pressure as in tcp_relay.py: a client whose transport is full
pauses its upstream connection's reading. A client that leaves (or ends its side) mid-answer closes
that upstream connection (as the gateway's cancelled handler does); an upstream that fails before
its answer's head is a 502, after it the client's connection is closed. Not done, as no bench
request needs it: HEAD (its answer's framing), `Expect: 100-continue`, upgrades, request bodies
streamed upstream before they end, a retry on a pooled connection the upstream had closed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, cast

import httptools

from slotshift_tools.gateway_bench.upstream import run_relay, serve_until_signalled

_NOT_FORWARDED_DOWNSTREAM: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"upgrade",
    }
)
"""Upstream headers the client does not get: the hop-by-hop ones. Transfer-Encoding and
Content-Length stay: the body goes on as the upstream framed it."""
_NOT_FORWARDED_UPSTREAM: Final = _NOT_FORWARDED_DOWNSTREAM | {
    b"transfer-encoding",
    b"expect",
    b"host",
    b"content-length",
    b"authorization",
}
"""Client headers the upstream does not get (as the gateway's relay.NOT_FORWARDED_UPSTREAM): the
hop-by-hop ones, the client's key; Host and Content-Length are written anew."""
MAX_HEAD_BYTES: Final = 64 * 1024
"""An answer's head may not be longer (a request's is bounded by llhttp's own limits)."""


def _answer(status: int, reason: bytes, message: str, *, close: bool = False) -> bytes:
    """A whole OpenAI-shaped error answer."""
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None}}
    ).encode()
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status,
        reason,
        len(body),
        b"Connection: close\r\n" if close else b"",
        body,
    )


_UNAUTHORIZED: Final = _answer(401, b"Unauthorized", "missing or unknown API key")
_BAD_GATEWAY: Final = _answer(502, b"Bad Gateway", "the upstream could not be reached")
_BAD_REQUEST: Final = _answer(400, b"Bad Request", "malformed HTTP request", close=True)
_VERSION_NOT_SUPPORTED: Final = _answer(
    505, b"HTTP Version Not Supported", "HTTP/1.1 only", close=True
)


def tenants_by_key(pairs: Iterable[str]) -> dict[str, str]:
    """`NAME=KEY` pairs as {KEY: NAME}; ValueError for a pair without `=` or a key named twice."""
    tenants: dict[str, str] = {}
    for pair in pairs:
        name, sep, key = pair.partition("=")
        if not sep or not name or not key:
            raise ValueError(f"a tenant key is NAME=KEY, not {pair!r}")
        if key in tenants:
            raise ValueError(f"key of {name!r} is also {tenants[key]!r}'s")
        tenants[key] = name
    return tenants


@dataclass
class _Request:
    """One parsed client request, ready to send on."""

    tenant: str | None
    """None: answered by the relay itself (no key or one of no tenant: 401; not HTTP/1.1)."""
    data: bytes
    """The whole request as the upstream gets it (head and body); the relay's whole answer
    where `tenant` is None."""
    close_after: bool
    """The client asked to close the connection after this answer."""


@dataclass
class _Parsing:
    """The request being parsed: what llhttp's callbacks gave so far."""

    url: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    authorization: bytes | None = None
    keep_alive: bool = True


class ProtocolRelay:
    """The relay's shared state: the tenants by key, the upstream's address, the pool of idle
    upstream connections and each tenant's requests in flight. `accepted` is the server's
    protocol factory; `close` closes the pool."""

    def __init__(self, upstream_host: str, upstream_port: int, tenants: Mapping[str, str]) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._host_header = b"Host: %s:%d\r\n" % (upstream_host.encode(), upstream_port)
        self._tenants = {key.encode(): name for key, name in tenants.items()}
        self.idle: list[UpstreamConnection] = []
        """Upstream connections between answers, the most recently used last."""
        self.in_flight: dict[str, int] = dict.fromkeys(sorted(set(tenants.values())), 0)
        """Each tenant's requests sent on and not yet answered whole."""
        self.upstream_connections_opened = 0

    def accepted(self) -> ClientConnection:
        return ClientConnection(self)

    def tenant_of(self, authorization: bytes | None) -> str | None:
        """The tenant of an `Authorization` value, None when it names none."""
        if authorization is None:
            return None
        scheme, _, key = authorization.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        return self._tenants.get(key.strip())

    def request_bytes(self, method: bytes, parsing: _Parsing) -> bytes:
        """The request as the upstream gets it."""
        lines: list[bytes | bytearray] = [method, b" ", parsing.url, b" HTTP/1.1\r\n"]
        lines.append(self._host_header)
        for name, value in parsing.headers:
            if name.lower() not in _NOT_FORWARDED_UPSTREAM:
                lines += (name, b": ", value, b"\r\n")
        body = parsing.body
        if body or method not in (b"GET", b"DELETE", b"OPTIONS"):
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines += (b"\r\n", body)
        return b"".join(lines)

    async def open_upstream(self) -> UpstreamConnection:
        """A new connection to the upstream (OSError when it cannot be made)."""
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: UpstreamConnection(self), *self._upstream
        )
        self.upstream_connections_opened += 1
        return connection

    def close(self) -> None:
        """Close the idle upstream connections."""
        idle, self.idle = self.idle, []
        for connection in idle:
            connection.close()


class ClientConnection(asyncio.Protocol):
    """One client's connection: its requests parsed, sent on one at a time, answered in order."""

    def __init__(self, relay: ProtocolRelay) -> None:
        self._relay = relay
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._parsing = _Parsing()
        self._queue: deque[_Request] = deque()
        """Requests parsed and not yet sent (a pipelining client's)."""
        self._current: _Request | None = None
        """The request sent on whose answer is not yet whole."""
        self._upstream: UpstreamConnection | None = None
        """The upstream connection answering the current request (None while it opens)."""
        self._opening: asyncio.Task[None] | None = None
        """The task opening an upstream connection for the current request, held so that it
        is not collected."""
        self.writing_paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(_BAD_REQUEST)
            return
        except httptools.HttpParserError:
            self._fail(_BAD_REQUEST)
            return
        if self._current is None:
            self._next()

    def eof_received(self) -> bool | None:
        # A client's end of its connection is taken as its leaving (as aiohttp's server, and so
        # the gateway, takes it): the transport closes and connection_lost follows.
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._queue.clear()
        # An upstream connection still opening goes to the pool when it is made (_open_and_send).
        upstream = self._upstream
        self._upstream = None
        if upstream is not None:
            # Mid-answer: the connection cannot carry another request; closing it is how the
            # upstream learns that nobody reads the answer.
            upstream.abandon()
        self._end_current()

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self._upstream is not None:
            self._upstream.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._upstream is not None:
            self._upstream.resume_reading()

    # llhttp's callbacks (httptools calls only those a protocol has)

    def on_message_begin(self) -> None:
        self._parsing = _Parsing()

    def on_url(self, url: bytes) -> None:
        self._parsing.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsing.headers.append((name, value))
        if len(name) == 13 and name.lower() == b"authorization":
            self._parsing.authorization = value

    def on_headers_complete(self) -> None:
        # Here, not after the message: llhttp resets what it is read from between messages.
        self._parsing.keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._parsing.body += body

    def on_message_complete(self) -> None:
        parsing = self._parsing
        if self._parser.get_http_version() != "1.1":
            self._queue.append(_Request(None, _VERSION_NOT_SUPPORTED, close_after=True))
            return
        tenant = self._relay.tenant_of(parsing.authorization)
        data = (
            self._relay.request_bytes(self._parser.get_method(), parsing)
            if tenant is not None
            else _UNAUTHORIZED
        )
        self._queue.append(_Request(tenant, data, close_after=not parsing.keep_alive))

    # the relay's own

    def _next(self) -> None:
        """Send the next queued request on, or answer it here; until one is in flight."""
        relay = self._relay
        while self._current is None and self._queue and self._transport is not None:
            request = self._queue.popleft()
            if request.tenant is None:
                # Answered here (401, 505): `data` is the whole answer.
                self._transport.write(request.data)
                if request.close_after:
                    self._close()
                continue
            self._current = request
            relay.in_flight[request.tenant] += 1
            if relay.idle:
                upstream = relay.idle.pop()
                self._upstream = upstream
                upstream.send(self, request.data)
            else:
                self._opening = asyncio.get_running_loop().create_task(
                    self._open_and_send(request), name="protocol-relay-open"
                )

    async def _open_and_send(self, request: _Request) -> None:
        try:
            upstream = await self._relay.open_upstream()
        except OSError:
            self._opening = None
            self.upstream_failed(answered=False)
            return
        self._opening = None
        if self._transport is None or self._current is not request:
            # The client left while the connection opened: keep it for the next.
            self._relay.idle.append(upstream)
            return
        self._upstream = upstream
        upstream.send(self, request.data)

    def write(self, data: bytes | bytearray) -> None:
        """Part of the current answer, to the client."""
        if self._transport is not None:
            self._transport.write(data)

    def answered(self, keep_alive: bool) -> None:
        """The current answer was written whole; its upstream connection is free (`keep_alive`:
        whether the upstream would have it carry another request)."""
        upstream = self._upstream
        self._upstream = None
        if upstream is not None:
            upstream.release(keep_alive)
        close = self._current is not None and self._current.close_after
        self._end_current()
        if close:
            self._close()
        else:
            self._next()

    def upstream_failed(self, *, answered: bool) -> None:
        """The current request's upstream connection failed or closed: before its answer's
        head (`answered` false) a 502 here, else the client's connection closes (its answer
        cannot be ended otherwise)."""
        self._upstream = None
        close = answered or (self._current is not None and self._current.close_after)
        if not answered and self._transport is not None:
            self._transport.write(_BAD_GATEWAY)
        self._end_current()
        if close:
            self._close()
        else:
            self._next()

    def _end_current(self) -> None:
        if self._current is not None and self._current.tenant is not None:
            self._relay.in_flight[self._current.tenant] -= 1
        self._current = None

    def _fail(self, answer: bytes) -> None:
        if self._transport is not None and self._current is None:
            self._transport.write(answer)
        self._close()

    def _close(self) -> None:
        self._queue.clear()
        if self._transport is not None:
            self._transport.close()


class UpstreamConnection(asyncio.Protocol):
    """One pooled connection to the upstream: one request at a time, its answer relayed to the
    client connection that sent it."""

    def __init__(self, relay: ProtocolRelay) -> None:
        self._relay = relay
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._client: ClientConnection | None = None
        self._head: bytearray | None = None
        """The answer's bytes until its head is parsed (None once it is: bytes go straight on)."""
        self._status = b""
        self._headers: list[bytes] = []
        self._until_close = True
        """The answer has no framing of its own: it ends when the upstream closes."""
        self._keep_alive = False
        self._head_done = False
        self._complete = False
        self._reading_paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        client = self._client
        if client is None:
            # Bytes no request asked for: the connection's framing is lost.
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._client = None
            self.close()
            client.upstream_failed(answered=self._head is None)
            return
        head = self._head
        if head is None:
            client.write(data)
        else:
            head += data
            if not self._head_done:
                if len(head) > MAX_HEAD_BYTES:
                    self._client = None
                    self.close()
                    client.upstream_failed(answered=False)
                return
            self._head = None
            body = head[head.index(b"\r\n\r\n") + 4 :]
            client.write(self._client_head() + body)
        if self._complete:
            self._client = None
            client.answered(self._keep_alive)

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self in self._relay.idle:
            self._relay.idle.remove(self)
        client = self._client
        self._client = None
        if client is not None:
            client.upstream_failed(answered=self._head is None)

    # llhttp's callbacks

    def on_status(self, status: bytes) -> None:
        self._status += status

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self._until_close = False
        if lowered not in _NOT_FORWARDED_DOWNSTREAM:
            self._headers += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._keep_alive = self._parser.should_keep_alive()

    def on_message_complete(self) -> None:
        self._complete = True

    # the relay's own

    def send(self, client: ClientConnection, request: bytes) -> None:
        """Send `request` for `client`, whose answer this connection relays to it."""
        assert self._transport is not None
        self._client = client
        self._head = bytearray()
        self._status = b""
        self._headers = []
        self._until_close = True
        self._head_done = False
        self._complete = False
        if client.writing_paused:
            self.pause_reading()
        self._transport.write(request)

    def _client_head(self) -> bytes:
        status = self._parser.get_status_code()
        close = b"Connection: close\r\n" if self._until_close else b""
        return b"HTTP/1.1 %d %s\r\n%s%s\r\n" % (
            status,
            self._status,
            b"".join(self._headers),
            close,
        )

    def release(self, keep_alive: bool) -> None:
        """The answer is whole: back to the pool, or closed when it may carry no other."""
        self.resume_reading()
        if keep_alive and self._transport is not None and not self._transport.is_closing():
            self._relay.idle.append(self)
        else:
            self.close()

    def abandon(self) -> None:
        """Its client left mid-answer: close it."""
        self._client = None
        self.close()

    def pause_reading(self) -> None:
        if self._transport is not None and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def _main(args: argparse.Namespace) -> None:
    relay = ProtocolRelay(args.upstream_host, args.upstream_port, tenants_by_key(args.tenant_key))
    try:
        await serve_until_signalled(relay.accepted, args.host, args.port)
    finally:
        relay.close()


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenant-key",
        action="append",
        default=[],
        metavar="NAME=KEY",
        help="a tenant and one of its API keys (repeat for each)",
    )


def main(argv: list[str] | None = None) -> int:
    """Relay until SIGINT or SIGTERM; exit status 0."""
    return run_relay("slotshift_tools.gateway_bench.protocol_relay", _main, argv, _arguments)


if __name__ == "__main__":
    raise SystemExit(main())
