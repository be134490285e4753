"""The agent's HTTP endpoint: Prometheus /metrics and a /health summary."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from slotshift.keys import bearer_matches
from slotshift.metrics_guard import metrics_token_digest, metrics_unauthorized


class AgentHttpServer:
    """Serves /metrics from `registry` and /health from `health` on host:port (0 picks one).

    `health` returns (serving, details): 200 while serving, 503 once the agent is stopping.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, Mapping[str, object]]],
        *,
        host: str,
        port: int,
        token_file: str | None = None,
    ) -> None:
        """token_file: the bearer token /metrics asks for (read at start); None: open."""
        self._registry = registry
        self._token_file = token_file
        self._token_digest: bytes | None = None
        self._health = health
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        """The port actually bound, once started."""

    async def start(self) -> None:
        """Bind and start serving."""
        if self._token_file is not None:
            self._token_digest = await asyncio.to_thread(
                metrics_token_digest, self._token_file, "agent.metrics_token_file"
            )
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health_check)
        # One access-log line per Prometheus scrape would drown the agent's own log.
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self.bound_port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop serving and release the port."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._token_digest is not None and not bearer_matches(
            request.headers.get("Authorization"), self._token_digest
        ):
            return metrics_unauthorized()
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health_check(self, _request: web.Request) -> web.Response:
        serving, details = self._health()
        return web.json_response(
            {"status": "serving" if serving else "stopping", **details},
            status=200 if serving else 503,
        )
