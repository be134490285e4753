"""The relay on asyncio protocols and llhttp, on real sockets: what it sends on, what it relays
back byte for byte, its kept-alive client connections and pooled upstream ones, its 401."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from slotshift_tools.gateway_bench.protocol_relay import (
    ProtocolRelay,
    tenants_by_key,
)
from slotshift_tools.gateway_bench.upstream import UpstreamProtocol
from tests.support import wait_until

HOST = "127.0.0.1"
KEYS = {"interactive": "key-i", "batch": "key-b"}
STREAM_EVENTS = 50


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def stream_writes() -> list[bytes]:
    """What the scripted upstream writes for /stream, one write each: its head, then numbered
    events, one HTTP chunk each, every fifth chunk cut across two writes, then the last chunk."""
    writes = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    ]
    for index in range(STREAM_EVENTS):
        chunk = _chunk(b'data: {"n": %d}\n\n' % index)
        if index % 5 == 4:
            writes += [chunk[:7], chunk[7:]]
        else:
            writes.append(chunk)
    writes.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return writes


@dataclass
class Seen:
    """What the scripted upstream saw: each request's head lines and body, its connections."""

    requests: list[tuple[list[str], bytes]] = field(default_factory=list)
    connections: int = 0
    closed: int = 0


class ScriptedUpstream(asyncio.Protocol):
    """A test upstream: /json answers a JSON body (Content-Length), /stream the events of
    `stream_writes`, each write in its own turn of the loop, /hold its head and one event and
    then nothing until the connection closes."""

    def __init__(self, seen: Seen) -> None:
        self._seen = seen
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._seen.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._seen.closed += 1

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if len(self._buffer) < end + 4 + length:
            return
        body = bytes(self._buffer[end + 4 : end + 4 + length])
        del self._buffer[: end + 4 + length]
        self._seen.requests.append((lines, body))
        self._answer(lines[0].split(" ")[1].partition("?")[0], body)

    def _answer(self, path: str, body: bytes) -> None:
        assert self._transport is not None
        if path == "/json":
            answer = json.dumps({"echo": body.decode()}).encode()
            self._transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
            )
        elif path == "/stream":
            self._write_each(stream_writes())
        elif path == "/hold":
            self._transport.write(stream_writes()[0] + _chunk(b"data: first\n\n"))
        else:
            self._transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def _write_each(self, writes: list[bytes]) -> None:
        if self._transport is None or not writes:
            return
        self._transport.write(writes[0])
        asyncio.get_running_loop().call_soon(self._write_each, writes[1:])


@dataclass
class Running:
    relay: ProtocolRelay
    url: str
    port: int
    upstream_port: int
    seen: Seen


async def _server(factory: Callable[[], asyncio.Protocol]) -> tuple[asyncio.Server, int]:
    server = await asyncio.get_running_loop().create_server(factory, HOST, 0)
    port: int = server.sockets[0].getsockname()[1]
    return server, port


@asynccontextmanager
async def relay_before(
    upstream_factory: Callable[[Seen], asyncio.Protocol],
) -> AsyncIterator[Running]:
    """The relay on port 0 in front of an upstream of `upstream_factory`'s on port 0."""
    seen = Seen()
    upstream, upstream_port = await _server(lambda: upstream_factory(seen))
    relay = ProtocolRelay(HOST, upstream_port, {key: name for name, key in KEYS.items()})
    server, port = await _server(relay.accepted)
    try:
        yield Running(relay, f"http://{HOST}:{port}", port, upstream_port, seen)
    finally:
        server.close()
        relay.close()
        await wait_until(
            lambda: seen.closed == seen.connections, message="the upstream connections closed"
        )
        upstream.close()
        await server.wait_closed()
        await upstream.wait_closed()


class RawClient:
    """One client connection, HTTP spoken by hand: what the relay writes, byte for byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection(HOST, port)
        return cls(reader, writer)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()

    def send(self, path: str, body: bytes, key: str | None) -> None:
        headers = f"POST {path} HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
        if key is not None:
            headers += f"Authorization: Bearer {key}\r\n"
        headers += f"Content-Length: {len(body)}\r\n\r\n"
        self.writer.write(headers.encode() + body)

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The next answer: its status, headers (names lowered) and body as it came (a chunked
        body with its framing)."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            return (
                int(status_line.split()[1]),
                headers,
                await self.reader.readexactly(int(headers["content-length"])),
            )
        assert headers.get("transfer-encoding") == "chunked", headers
        body = bytearray()
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line, 16)
            body += size_line + await self.reader.readexactly(size + 2)
            if size == 0:
                return int(status_line.split()[1]), headers, bytes(body)


def _unchunked(framed: bytes) -> bytes:
    data = bytearray()
    while True:
        size_line, _, framed = framed.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(data)
        data += framed[:size]
        framed = framed[size + 2 :]


async def test_a_non_streamed_request_is_sent_on_and_its_answer_relayed() -> None:
    async with relay_before(ScriptedUpstream) as running:
        client = await RawClient.connect(running.port)
        try:
            client.send("/json?x=1", b'{"prompt": "hi"}', KEYS["interactive"])
            status, headers, body = await client.answer()
        finally:
            await client.close()
        assert status == 200
        assert headers["content-type"] == "application/json"
        assert json.loads(body) == {"echo": '{"prompt": "hi"}'}
        [(lines, sent_body)] = running.seen.requests
        assert lines[0] == "POST /json?x=1 HTTP/1.1"
        sent = {line.partition(":")[0].lower(): line.partition(":")[2].strip() for line in lines}
        # The client's key goes no further; Host names the upstream; the body as it came.
        assert "authorization" not in sent
        assert sent["host"] == f"{HOST}:{running.upstream_port}"
        assert sent["content-type"] == "application/json"
        assert sent_body == b'{"prompt": "hi"}'
        assert sent["content-length"] == str(len(sent_body))
        await wait_until(lambda: running.relay.in_flight == {"interactive": 0, "batch": 0})


async def test_a_stream_is_relayed_byte_for_byte_in_order() -> None:
    async with relay_before(ScriptedUpstream) as running:
        client = await RawClient.connect(running.port)
        try:
            client.send("/stream", b"{}", KEYS["batch"])
            status, headers, body = await client.answer()
        finally:
            await client.close()
        assert status == 200
        assert headers["content-type"] == "text/event-stream"
        assert "connection" not in headers, "the upstream's hop-by-hop headers stay there"
        # The upstream's chunks as it framed them, every byte, in order.
        written = b"".join(stream_writes())
        assert body == written[written.index(b"\r\n\r\n") + 4 :]
        events = _unchunked(body).split(b"\n\n")
        assert events[:STREAM_EVENTS] == [b'data: {"n": %d}' % n for n in range(STREAM_EVENTS)]
        assert events[STREAM_EVENTS:] == [b"data: [DONE]", b""]


async def test_requests_on_one_kept_alive_connection_share_one_upstream_connection() -> None:
    async with relay_before(ScriptedUpstream) as running:
        client = await RawClient.connect(running.port)
        try:
            client.send("/stream", b"{}", KEYS["batch"])
            first = await client.answer()
            client.send("/json", b"second", KEYS["interactive"])
            second = await client.answer()
            # Pipelined: both sent before either is answered, answered in order.
            client.send("/json", b"third", KEYS["interactive"])
            client.send("/stream", b"{}", KEYS["batch"])
            third = await client.answer()
            fourth = await client.answer()
        finally:
            await client.close()
        assert [answer[0] for answer in (first, second, third, fourth)] == [200] * 4
        assert json.loads(second[2]) == {"echo": "second"}
        assert json.loads(third[2]) == {"echo": "third"}
        assert fourth[2] == first[2]
        assert [body for _, body in running.seen.requests] == [b"{}", b"second", b"third", b"{}"]
        assert running.seen.connections == 1
        assert running.relay.upstream_connections_opened == 1


async def test_an_unknown_or_missing_key_is_answered_401_and_the_connection_kept() -> None:
    async with relay_before(ScriptedUpstream) as running:
        client = await RawClient.connect(running.port)
        try:
            client.send("/json", b"x", "not-a-key")
            unknown = await client.answer()
            client.send("/json", b"x", None)
            missing = await client.answer()
            client.send("/json", b"after", KEYS["batch"])
            after = await client.answer()
        finally:
            await client.close()
        for status, headers, body in (unknown, missing):
            assert status == 401
            assert headers["content-type"] == "application/json"
            assert json.loads(body)["error"]["message"]
        assert after[0] == 200 and json.loads(after[2]) == {"echo": "after"}
        # Nothing of the refused requests reached the upstream.
        assert [body for _, body in running.seen.requests] == [b"after"]


async def test_a_client_gone_mid_stream_closes_its_upstream_connection() -> None:
    async with relay_before(ScriptedUpstream) as running:
        client = await RawClient.connect(running.port)
        try:
            client.send("/hold", b"{}", KEYS["batch"])
            await client.reader.readuntil(b"data: first\n\n")
            assert running.relay.in_flight["batch"] == 1
        finally:
            await client.close()
        await wait_until(lambda: running.seen.closed == 1, message="the upstream connection closed")
        await wait_until(lambda: running.relay.in_flight["batch"] == 0)
        assert running.relay.idle == []


async def test_an_http_client_gets_the_bench_upstreams_answers_through_it() -> None:
    # aiohttp's client, as the bench's: the relayed framing is what an HTTP client reads.
    def bench_upstream(seen: Seen) -> asyncio.Protocol:
        return UpstreamProtocol(5000.0)

    async with (
        relay_before(bench_upstream) as running,
        aiohttp.ClientSession() as session,
    ):
        headers = {"Authorization": f"Bearer {KEYS['interactive']}"}
        url = f"{running.url}/v1/completions"
        body: dict[str, Any] = {"prompt": "hi", "max_tokens": 4}
        async with session.post(url, json=body, headers=headers) as response:
            assert response.status == 200
            whole = await response.json()
        assert whole["usage"]["completion_tokens"] == 4
        async with session.post(url, json={**body, "stream": True}, headers=headers) as response:
            assert response.status == 200
            streamed = (await response.read()).split(b"\n\n")
        assert streamed[-2:] == [b"data: [DONE]", b""]
        assert len(streamed) == 4 + 2
        assert running.relay.upstream_connections_opened == 1


def test_tenant_keys_are_read_from_name_key_pairs() -> None:
    assert tenants_by_key(["a=k1", "b=k=2"]) == {"k1": "a", "k=2": "b"}
    with pytest.raises(ValueError, match="NAME=KEY"):
        tenants_by_key(["a"])
    with pytest.raises(ValueError, match="also"):
        tenants_by_key(["a=k", "b=k"])
