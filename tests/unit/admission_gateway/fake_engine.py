"""A small OpenAI-like upstream for the gateway tests (not the emulator: just enough to probe).

It answers /v1/completions, /v1/chat/completions (streamed or not), /v1/models and /tokenize
(one id per character), counts the
requests it holds at once per tenant (tests name the tenant in the body's `user` field), records
the headers it receives, and can be told to fail in the ways an engine fails.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Behaviour = Literal["ok", "hang", "reset", "status", "reset_mid_stream"]

CONTENT_PIECES = ("Hello", ", ", "world")


@dataclass
class FakeEngine:
    """Set `behaviour` (and `gate`) before a request to choose what it gets."""

    behaviour: Behaviour = "ok"
    error_status: int = 404
    gate: asyncio.Event | None = None
    """When set to an Event, requests wait for it (streams after their first chunk)."""
    in_flight: Counter[str] = field(default_factory=Counter)
    peak_in_flight: Counter[str] = field(default_factory=Counter)
    served: Counter[str] = field(default_factory=Counter)
    aborted: int = 0
    """Requests whose client (the gateway) went away before they were answered."""
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    tokenize_status: int = 200
    tokenize_gate: asyncio.Event | None = None
    """When set to an Event, /tokenize answers once it is set."""
    prompts_seen: list[Any] = field(default_factory=list)
    """Each generation request's `prompt` (None for a chat)."""
    set_cookie: str | None = None
    """A Set-Cookie value every non-streamed answer carries (as a sticky balancer's would)."""
    """What /tokenize answers with: 200 counts a token per character, any other is an error."""
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/completions", self._generate),
                web.post("/v1/chat/completions", self._generate),
                web.get("/v1/models", self._models),
                web.post("/tokenize", self._tokenize),
            ]
        )
        # handler_cancellation, like vLLM: a dropped connection aborts the request.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self.headers_seen.append(dict(request.headers))
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        self.headers_seen.append(dict(request.headers))
        if self.tokenize_gate is not None:
            await self.tokenize_gate.wait()
        if self.tokenize_status != 200:
            return web.json_response({"object": "error"}, status=self.tokenize_status)
        prompt = str((await request.json()).get("prompt", ""))
        tokens = [ord(c) for c in prompt]
        return web.json_response({"count": len(tokens), "max_model_len": 512, "tokens": tokens})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.headers_seen.append(dict(request.headers))
        body = await request.json()
        self.prompts_seen.append(body.get("prompt"))
        tenant = str(body.get("user", ""))
        self.in_flight[tenant] += 1
        self.peak_in_flight[tenant] = max(self.peak_in_flight[tenant], self.in_flight[tenant])
        try:
            response = await self._answer(request, body)
            self.served[tenant] += 1
            return response
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        finally:
            self.in_flight[tenant] -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        if self.behaviour == "hang":
            await asyncio.Event().wait()
        if self.behaviour == "reset":
            assert request.transport is not None
            request.transport.close()
            await asyncio.Event().wait()
        if self.behaviour == "status":
            error = {"message": "The model `x` does not exist.", "type": "NotFoundError"}
            return web.json_response(
                {"object": "error", **error, "param": None, "code": self.error_status},
                status=self.error_status,
            )
        if body.get("stream"):
            return await self._stream(request, chat)
        if self.gate is not None:
            await self.gate.wait()
        text = "".join(CONTENT_PIECES)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "stop"}
        )
        answer = web.json_response(
            {
                "id": "cmpl-1",
                "object": "chat.completion" if chat else "text_completion",
                "created": 1,
                "model": body.get("model", "fake"),
                "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
            }
        )
        if self.set_cookie is not None:
            answer.headers["Set-Cookie"] = self.set_cookie
        return answer

    async def _stream(self, request: web.Request, chat: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events: list[dict[str, Any]] = []
        if chat:
            events.append(_chunk(chat, {"role": "assistant", "content": ""}))
        events.extend(_chunk(chat, piece) for piece in CONTENT_PIECES)
        # vLLM's last content chunk says why the answer ended.
        events[-1]["choices"][0]["finish_reason"] = "stop"
        for index, event in enumerate(events):
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            if index == 0 and self.gate is not None:
                await self.gate.wait()
            if index == 0 and self.behaviour == "reset_mid_stream":
                assert request.transport is not None
                request.transport.close()
                return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _chunk(chat: bool, delta: dict[str, str] | str) -> dict[str, Any]:
    if chat:
        content = delta if isinstance(delta, dict) else {"content": delta}
        choice: dict[str, Any] = {"index": 0, "delta": content, "finish_reason": None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": delta, "finish_reason": None}
        kind = "text_completion"
    return {"id": "cmpl-1", "object": kind, "created": 1, "model": "fake", "choices": [choice]}
