"""End to end: `slotshift up` supervises its services. Kill -9 the control plane under load: the
gateways go on serving (no client request fails), `slotshift up` restarts it by itself, and the
gateways resync with the new one; the stack keeps running."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.conftest import RunningStack, running_stack
from tests.e2e.service_processes import grpc_serving
from tests.support import wait_until

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-3B-Instruct"
KEYS = ("demo-key-a", "demo-key-b")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[RunningStack]:
    overrides = {"gateway.reconnect_initial_s": 0.05, "gateway.reconnect_max_s": 0.2}
    with running_stack(tmp_path, overrides=overrides, period_s=0.5) as running:
        yield running


def _pids(log: Path, service: str) -> list[int]:
    """The pids `slotshift up` logged for `service`, in order (each start and restart)."""
    pattern = re.compile(rf"\b{service} is ready(?: again)? \(pid (\d+)\)")
    return [int(m.group(1)) for m in pattern.finditer(log.read_text(errors="replace"))]


async def test_a_killed_control_plane_is_restarted_and_no_request_fails(
    stack: RunningStack,
) -> None:
    ok = 0
    failed: list[str] = []
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession, url: str, key: str) -> None:
        nonlocal ok
        payload = {"model": MODEL, "prompt": "chaos", "max_tokens": 24, "ignore_eos": True}
        while not stop.is_set():
            try:
                async with session.post(
                    f"{url}/v1/completions",
                    json=payload,
                    headers={"Authorization": f"Bearer {key}"},
                ) as response:
                    await response.read()
                    if response.status == 200:
                        ok += 1
                    else:
                        failed.append(f"HTTP {response.status}")
            except aiohttp.ClientError as exc:
                failed.append(type(exc).__name__)
                await asyncio.sleep(0.05)

    (first,) = _pids(stack.log, "controlplane")
    async with (
        aiohttp.ClientSession() as session,
        asyncio.TaskGroup() as clients,
    ):
        for url in stack.gateway_urls:
            for key in KEYS:
                for index in range(4):
                    clients.create_task(client(session, url, key), name=f"client-{key}-{index}")
        await wait_until(lambda: ok > 40, timeout_s=20, message="load flowing")
        os.kill(first, signal.SIGKILL)
        at_kill = ok
        await wait_until(
            lambda: len(_pids(stack.log, "controlplane")) == 2,
            timeout_s=20,
            message="slotshift up restarting the control plane",
        )
        await wait_until(
            lambda: grpc_serving(stack.grpc_target), timeout_s=10, message="the new one serving"
        )
        await wait_until(lambda: ok > at_kill + 40, timeout_s=20, message="load after the restart")
        stop.set()
    assert stack.process.poll() is None, "slotshift up keeps running"
    assert failed == [], "no request fails because the control plane died"
    assert "controlplane exited with status -9; restarting it" in stack.log.read_text()
