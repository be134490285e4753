"""A stand-in for an engine's /metrics: a real aiohttp server on port 0 serving a settable text."""

from __future__ import annotations

import asyncio

from aiohttp import web


class FakeEngineMetrics:
    """Serves `text` at /metrics with `status`; `stall` makes it answer only when released."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.status = 200
        self.stall = False
        self.requests = 0
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/metrics"

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, _request: web.Request) -> web.Response:
        self.requests += 1
        if self.stall:
            await self._release.wait()
        return web.Response(text=self.text, status=self.status, content_type="text/plain")
