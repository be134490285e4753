"""Capture a real vLLM /metrics scrape for the telemetry agent's tests.

Starts the CPU vLLM (slotshift_tools/vllm_cpu) with a batch of 4, gives it some history (completed
requests, one stream its client abandons), then loads it with 12 long requests and scrapes it
while 4 run and 8 wait. Usage: .venv/bin/python scripts/capture_vllm_scrape.py OUT_FILE
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp

from slotshift_tools.vllm_cpu import (
    VllmCpuPaths,
    VllmServer,
    VllmServerSettings,
    ensure_environment,
    ensure_model,
)
from slotshift_tools.vllm_cpu.server import free_local_port

BATCH = 4
LOAD = 12
MODEL = "slotshift/tiny-llama"


async def capture(server: VllmServer) -> str:
    completions = f"{server.url}/v1/completions"
    async with aiohttp.ClientSession() as session:
        for index in range(8):
            body = {"model": MODEL, "prompt": f"warm up {index}", "max_tokens": 16}
            async with session.post(completions, json={**body, "ignore_eos": True}) as response:
                response.raise_for_status()
                await response.read()
        abandoned = {"model": MODEL, "prompt": "left", "max_tokens": 200, "stream": True}
        async with session.post(completions, json={**abandoned, "ignore_eos": True}) as response:
            await response.content.readline()  # the client goes away after the first event

        async def long_request(index: int) -> None:
            body = {"model": MODEL, "prompt": f"load {index}", "max_tokens": 400}
            async with session.post(completions, json={**body, "ignore_eos": True}) as response:
                await response.read()

        load = [asyncio.create_task(long_request(i)) for i in range(LOAD)]
        try:
            while True:
                async with session.get(server.metrics_url) as response:
                    text = await response.text()
                if _gauge(text, "vllm:num_requests_running") == BATCH and (
                    _gauge(text, "vllm:num_requests_waiting") == LOAD - BATCH
                ):
                    return text
                await asyncio.sleep(0.05)
        finally:
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)


def _gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def main(out: Path) -> int:
    paths = VllmCpuPaths.for_checkout()
    python = ensure_environment(paths)
    model = ensure_model(paths, python)
    settings = VllmServerSettings(
        port=free_local_port(), served_model_name=MODEL, max_num_seqs=BATCH
    )
    with VllmServer(paths, model, settings) as server:
        server.start(os.environ)
        server.wait_until_ready(300)
        text = asyncio.run(capture(server))
    header = (
        "# A real vLLM /metrics scrape: vllm-cpu 0.32.0 (requirements/vllm-cpu.txt) serving the tiny\n"
        "# model of slotshift_tools/vllm_cpu with --max-num-seqs 4, captured by\n"
        "# scripts/capture_vllm_scrape.py after 8 completed requests and 1 stream its client left,\n"
        "# while 12 long requests were in: 4 running, 8 waiting.\n"
    )
    out.write_text(header + text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
