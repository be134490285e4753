"""The bench's engine: an OpenAI-compatible server cheap enough never to be the bottleneck.

    python -m slotshift_tools.gateway_bench.upstream --port 8000 --events-per-s 500

It answers the routes the gateway uses, in vLLM 0.32's shapes (admission_gateway/resume.py
names them): `POST /v1/completions` and `POST /v1/chat/completions`, streamed or not, with
`token_ids` when the request asks `return_token_ids`, `prompt_token_ids` on a completion's first
chunk (a chat's on its role chunk) and the final usage chunk when it asks
`stream_options.include_usage`; `POST /tokenize`, `GET /v1/models`, `GET /health`.

Cheap by construction: HTTP/1.1 on a bare asyncio.Protocol (keep-alive, chunked streams, no
framework), every token event rendered once at start (all tokens of a stream are the same
token: the gateway relays bytes, it does not read the text), only the first chunk and the usage
chunk rendered per request. A stream's first token is sent at once and each next one
1 / events_per_s later (on the loop's clock, so a late timer does not slow the pace down).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final

import uvloop

MODEL: Final = "bench-model"
TOKEN_ID: Final = 1234
"""The id of every generated token (the text is TOKEN_TEXT)."""
TOKEN_TEXT: Final = " tok"
DEFAULT_MAX_TOKENS: Final = 16
"""vLLM's completions default where a request names no max_tokens."""
MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 16 * 1024 * 1024
_SSE_HEAD: Final = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _dumps(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _chunked(event: bytes) -> bytes:
    """One HTTP chunk holding `event`."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def _sse(payload: Mapping[str, Any] | bytes) -> bytes:
    data = payload if isinstance(payload, bytes) else _dumps(payload)
    return b"data: " + data + b"\n\n"


def text_prompt_ids(text: str) -> list[int]:
    """The token ids /tokenize gives a text: one per whitespace-separated word (at least one),
    stable for the same text. The ids only need to be integers the gateway can carry."""
    words = text.split() or [text]
    return [100 + (sum(word.encode()) % 30000) for word in words]


@dataclass(frozen=True)
class Rendered:
    """The events every stream of one shape repeats, HTTP-chunked, rendered once."""

    token: bytes
    last_token: bytes
    done: bytes


def _render(chat: bool, with_ids: bool) -> Rendered:
    ids = [TOKEN_ID] if with_ids else None
    if chat:
        envelope = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": TOKEN_TEXT},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": ids,
        }
        last = {**choice, "finish_reason": "length", "stop_reason": None}
    else:
        envelope = {"id": "cmpl-bench", "object": "text_completion", "created": 0}
        choice = {
            "index": 0,
            "text": TOKEN_TEXT,
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": ids,
        }
        last = {**choice, "finish_reason": "length"}
    head = {**envelope, "model": MODEL}
    return Rendered(
        token=_chunked(_sse({**head, "choices": [choice]})),
        last_token=_chunked(_sse({**head, "choices": [last]})),
        done=_chunked(_sse(b"[DONE]")) + b"0\r\n\r\n",
    )


_RENDERED: Final = {
    (chat, ids): _render(chat, ids) for chat in (False, True) for ids in (False, True)
}


@dataclass(frozen=True)
class Generation:
    """What a completion request asks of the server."""

    chat: bool
    stream: bool
    max_tokens: int
    with_ids: bool
    include_usage: bool
    prompt_ids: list[int]


def parse_generation(path: str, body: Mapping[str, Any]) -> Generation:
    """The request's shape; ValueError for a body this server does not understand."""
    chat = path == "/v1/chat/completions"
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ValueError("messages must be a list")
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        prompt_ids = text_prompt_ids(text)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = text_prompt_ids(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise ValueError("prompt must be a string or a list of token ids")
        limit = body.get("max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if limit is None else int(limit)
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    options = body.get("stream_options") or {}
    return Generation(
        chat=chat,
        stream=bool(body.get("stream")),
        max_tokens=max_tokens,
        with_ids=bool(body.get("return_token_ids")),
        include_usage=bool(options.get("include_usage")) if isinstance(options, dict) else False,
        prompt_ids=prompt_ids,
    )


def _usage(generation: Generation) -> dict[str, int]:
    prompt = len(generation.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + generation.max_tokens,
        "completion_tokens": generation.max_tokens,
    }


def first_events(generation: Generation) -> bytes:
    """What a stream starts with, HTTP-chunked: a chat's role chunk (with the prompt's ids when
    asked), then the first token (a completion's carries the prompt's ids when asked)."""
    ids = generation.prompt_ids if generation.with_ids else None
    if generation.chat:
        role = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "prompt_token_ids": ids,
            "prompt_text": None,
        }
        return _chunked(_sse(role)) + token_event(generation, 0)
    if ids is None:
        return token_event(generation, 0)
    last = generation.max_tokens == 1
    choice = {
        "index": 0,
        "text": TOKEN_TEXT,
        "logprobs": None,
        "finish_reason": "length" if last else None,
        "stop_reason": None,
        "prompt_token_ids": ids,
        "token_ids": [TOKEN_ID] if generation.with_ids else None,
    }
    head = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": MODEL}
    return _chunked(_sse({**head, "choices": [choice]}))


def token_event(generation: Generation, index: int) -> bytes:
    """Token `index`'s event (the last one carries the finish reason), HTTP-chunked."""
    rendered = _RENDERED[(generation.chat, generation.with_ids)]
    return rendered.last_token if index == generation.max_tokens - 1 else rendered.token


def closing_events(generation: Generation) -> bytes:
    """The usage chunk when asked, `[DONE]` and the end of the chunked body."""
    rendered = _RENDERED[(generation.chat, generation.with_ids)]
    if not generation.include_usage:
        return rendered.done
    identity = (
        {"id": "chatcmpl-bench", "object": "chat.completion.chunk"}
        if generation.chat
        else {"id": "cmpl-bench", "object": "text_completion"}
    )
    usage = {**identity, "created": 0, "model": MODEL, "choices": [], "usage": _usage(generation)}
    return _chunked(_sse(usage)) + rendered.done


def full_response(generation: Generation) -> dict[str, Any]:
    """A non-streamed answer: all max_tokens tokens at once, with usage."""
    ids = [TOKEN_ID] * generation.max_tokens if generation.with_ids else None
    text = TOKEN_TEXT * generation.max_tokens
    if generation.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": ids,
        }
        envelope = {"id": "chatcmpl-bench", "object": "chat.completion"}
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": ids,
            "prompt_token_ids": generation.prompt_ids if generation.with_ids else None,
        }
        envelope = {"id": "cmpl-bench", "object": "text_completion"}
    return {
        **envelope,
        "created": 0,
        "model": MODEL,
        "choices": [choice],
        "usage": _usage(generation),
    }


def _json_response(status: int, payload: Mapping[str, Any]) -> bytes:
    body = _dumps(payload)
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        reason.encode(),
        len(body),
        body,
    )


class UpstreamProtocol(asyncio.Protocol):
    """One client connection: requests one after the other (keep-alive, no pipelining)."""

    def __init__(self, events_per_s: float) -> None:
        self._interval_s = 1.0 / events_per_s
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        # The client left: the stream's next timer must not write to a closed transport.
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._streaming:
            self._serve_buffered()

    def _serve_buffered(self) -> None:
        while not self._streaming and self._transport is not None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    self._transport.close()
                return
            head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length > MAX_BODY_BYTES:
                self._transport.close()
                return
            if len(self._buffer) < end + 4 + length:
                return
            body = bytes(self._buffer[end + 4 : end + 4 + length])
            del self._buffer[: end + 4 + length]
            method, _, rest = head[0].partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            self._handle(method, path, body)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        if method == "GET" and path == "/health":
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        elif method == "GET" and path == "/v1/models":
            models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            transport.write(_json_response(200, models))
        elif method == "POST" and path == "/tokenize":
            try:
                query = json.loads(body)
                ids = text_prompt_ids(str(query.get("prompt", "")))
            except (ValueError, AttributeError):
                transport.write(_json_response(400, {"error": {"message": "bad request"}}))
                return
            transport.write(_json_response(200, {"count": len(ids), "tokens": ids}))
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            try:
                generation = parse_generation(path, json.loads(body))
            except (ValueError, TypeError, AttributeError) as exc:
                transport.write(_json_response(400, {"error": {"message": str(exc)}}))
                return
            if not generation.stream:
                transport.write(_json_response(200, full_response(generation)))
                return
            self._streaming = True
            transport.write(_SSE_HEAD + first_events(generation))
            loop = asyncio.get_running_loop()
            self._next(generation, 1, loop.time() + self._interval_s)
        else:
            transport.write(_json_response(404, {"error": {"message": f"no route {path}"}}))

    def _next(self, generation: Generation, index: int, due_s: float) -> None:
        """Send token `index` at `due_s` (or the end of the stream once all are sent)."""
        if index >= generation.max_tokens:
            if self._transport is not None:
                self._transport.write(closing_events(generation))
            self._streaming = False
            self._timer = None
            # A request that arrived while streaming (none from an HTTP/1.1 client) is next.
            self._serve_buffered()
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(due_s, self._send, generation, index, due_s)

    def _send(self, generation: Generation, index: int, due_s: float) -> None:
        if self._transport is None:
            return
        self._transport.write(token_event(generation, index))
        self._next(generation, index + 1, due_s + self._interval_s)


async def serve_protocol(
    factory: Callable[[], asyncio.Protocol], host: str, port: int, stop: asyncio.Event
) -> None:
    """Serve `factory`'s protocol on host:port until `stop` is set."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, host, port, backlog=1024)
    async with server:
        await stop.wait()


def signalled() -> asyncio.Event:
    """An event the running loop sets at SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def serve_until_signalled(
    factory: Callable[[], asyncio.Protocol], host: str, port: int
) -> None:
    """Serve `factory`'s protocol on host:port until SIGINT or SIGTERM."""
    await serve_protocol(factory, host, port, signalled())


def run_relay(
    module: str,
    relay: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
    argv: list[str] | None,
    more_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """A bench relay's command line (`python -m MODULE --port P --upstream-port U`, and what
    `more_arguments` adds to the parser): run `relay(args)` on uvloop until it returns (at SIGINT
    or SIGTERM); exit status 0."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-host", default="127.0.0.1")
    parser.add_argument("--upstream-port", type=int, required=True)
    if more_arguments is not None:
        more_arguments(parser)
    uvloop.run(relay(parser.parse_args(argv)))
    return 0


async def serve(host: str, port: int, events_per_s: float, stop: asyncio.Event) -> None:
    """Serve on host:port until `stop` is set."""
    await serve_protocol(lambda: UpstreamProtocol(events_per_s), host, port, stop)


async def _main(args: argparse.Namespace) -> None:
    await serve_until_signalled(lambda: UpstreamProtocol(args.events_per_s), args.host, args.port)


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGINT or SIGTERM; exit status 0."""
    parser = argparse.ArgumentParser(prog="python -m slotshift_tools.gateway_bench.upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--events-per-s", type=float, default=500.0, help="token events a second, per stream"
    )
    asyncio.run(_main(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
