"""Closed-loop clients through the gateways, run as a process of their own by tests/vllm's `Load`.

Threads of the test process would share its interpreter lock with everything the test does
(parsing vLLM's /metrics, running grpcurl): on two cores shared with vLLM they then keep far
fewer requests outstanding than they number, and a "backlogged" tenant's demand comes and goes.
One event loop in its own process keeps every client's request outstanding.

    python -m tests.vllm.load_process KEY MODEL MAX_TOKENS CLIENTS URL [URL ...]

Client i sends to URL i mod len(URLs), one non-streamed completion after another, until
SIGTERM; each then finishes the request it has in flight. Prints `ready` once it listens for
SIGTERM and is about to send (the test waits for it: on two cores busy with vLLM, starting
Python and aiohttp can take seconds, and a SIGTERM before then would end the process without a
word), then one JSON line at the end: {"completed": N, "failures": ["status: body", ...]}.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

import aiohttp


async def _run(key: str, model: str, max_tokens: int, clients: int, urls: list[str]) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    outcome: dict[str, Any] = {"completed": 0, "failures": []}
    body = {"model": model, "prompt": "batch", "max_tokens": max_tokens, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        print("ready", flush=True)

        async def client(index: int) -> None:
            url = f"{urls[index % len(urls)]}/v1/completions"
            while not stop.is_set():
                try:
                    async with session.post(url, json=body, headers=headers) as response:
                        content = await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    outcome["failures"].append(repr(exc))
                    continue
                if response.status == 200:
                    outcome["completed"] += 1
                else:
                    outcome["failures"].append(f"{response.status}: {content[:200]!r}")

        await asyncio.gather(
            *(asyncio.create_task(client(i), name=f"load client {i}") for i in range(clients))
        )
    print(json.dumps(outcome), flush=True)


def main(argv: list[str]) -> None:
    key, model, max_tokens, clients, *urls = argv
    asyncio.run(_run(key, model, int(max_tokens), int(clients), urls))


if __name__ == "__main__":
    main(sys.argv[1:])
