"""A fake OpenAI-compatible gateway for the client and load tests: streams vLLM-shaped chunks.

A body with `stream: false` gets the whole answer at once. The API key picks the behaviour: `ok` (the default for unknown keys), `no-usage`, `refuse`
(429), `error-event`, `cut` (no [DONE]), `hang` (never answers).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

CHUNK_GAP_S = 0.005
FIRST_TOKEN_DELAY_S = 0.02


@dataclass
class FakeGateway:
    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    running: Counter[str] = field(default_factory=Counter)
    """Requests being answered now, per key."""
    peak_running: Counter[str] = field(default_factory=Counter)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at shutdown: ends the `hang` answers."""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        key = request.headers["Authorization"].removeprefix("Bearer ")
        body = await request.json()
        self.requests.append(body)
        self.keys.append(key)
        self.running[key] += 1
        self.peak_running[key] = max(self.peak_running[key], self.running[key])
        try:
            return await self._answer(request, key, body)
        finally:
            self.running[key] -= 1

    async def _answer(
        self, request: web.Request, key: str, body: dict[str, Any]
    ) -> web.StreamResponse:
        if key == "refuse":
            return web.json_response({"error": {"message": "queue full"}}, status=429)
        if key == "hang":
            await self.released.wait()
            return web.json_response({"error": {"message": "released"}}, status=503)
        tokens = int(body["max_tokens"])
        if body.get("stream") is False:
            await asyncio.sleep(FIRST_TOKEN_DELAY_S + CHUNK_GAP_S * (tokens - 1))
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens}
            text = "".join(f"t{index}" for index in range(tokens))
            return web.json_response({"id": "cmpl-1", "choices": [{"text": text}], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(FIRST_TOKEN_DELAY_S)
        for index in range(tokens):
            if index:
                await asyncio.sleep(CHUNK_GAP_S)
            if key == "error-event" and index == 2:
                error = {"error": {"message": "engine timeout", "code": "upstream_timeout"}}
                await response.write(_event(error))
                return response
            chunk = {"id": "cmpl-1", "choices": [{"index": 0, "text": f"t{index}"}], "usage": None}
            await response.write(_event(chunk))
        if key == "cut":
            return response
        if key != "no-usage":
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens}
            await response.write(_event({"id": "cmpl-1", "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@asynccontextmanager
async def running_fake_gateway() -> AsyncIterator[FakeGateway]:
    gateway = FakeGateway()
    app = web.Application()
    app.router.add_post("/v1/completions", gateway.completions)
    # Cancel a handler whose client went away, as the real gateway's stream relay stops.
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    gateway.url = f"http://127.0.0.1:{port}"
    try:
        yield gateway
    finally:
        gateway.released.set()
        await runner.cleanup()
