"""The floor under an aiohttp proxy: the least an HTTP relay on aiohttp's server and client does,
measured beside the gateway.

    python -m slotshift_tools.gateway_bench.aiohttp_relay --port 9000 --upstream-port 8000

Each request is sent on to the upstream as it came (method, path, query, body, headers less the
hop-by-hop ones) on one pooled client session, and its answer relayed: an event stream read by
read, anything else read whole. No tenant, no key check, no limit, no figures, no tracing. On
uvloop, as the gateway runs. What a request costs here is aiohttp's: parsing and answering it on
the server side, sending it and reading its answer on the client side, and the event loop's
wake-ups between them, which any proxy built on aiohttp pays; the gateway's cost beyond it is its
own work (tcp_relay.py is the floor under that, with no HTTP at all).
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from slotshift_tools.gateway_bench.upstream import run_relay, signalled

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Headers each side sets for its own connection (aiohttp writes them)."""


def _passed_on(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict(
        (name, value) for name, value in headers.items() if name.lower() not in _HOP_BY_HOP
    )


class AiohttpRelay:
    """The relay's handler and its one client session."""

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # No pool limit: the bench's streams all run at once, as through the gateway.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        async with self._session.request(
            request.method,
            self._upstream + request.path_qs,
            data=body,
            headers=_passed_on(request.headers),
        ) as upstream:
            headers = _passed_on(upstream.headers)
            if upstream.content_type != "text/event-stream":
                return web.Response(
                    status=upstream.status, body=await upstream.read(), headers=headers
                )
            response = web.StreamResponse(status=upstream.status, headers=headers)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


async def _main(args: argparse.Namespace) -> None:
    relay = AiohttpRelay(f"http://{args.upstream_host}:{args.upstream_port}")
    await relay.start()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", relay.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = signalled()
    try:
        await web.TCPSite(runner, args.host, args.port, backlog=1024).start()
        await stop.wait()
    finally:
        await runner.cleanup()
        await relay.close()


def main(argv: list[str] | None = None) -> int:
    """Relay until SIGINT or SIGTERM; exit status 0."""
    return run_relay("slotshift_tools.gateway_bench.aiohttp_relay", _main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
