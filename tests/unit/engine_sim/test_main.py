"""The service entrypoint: ready line with its address, serves, stops when told."""

from __future__ import annotations

import asyncio
import logging
import re

import aiohttp
import pytest

from engine_sim.main import run
from slotshift.config import parse_config
from tests.support import wait_until


async def test_run_logs_ready_serves_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="engine_sim")
    config = parse_config(
        {
            "pools": [{"name": "default", "budget_slots": 4, "tenants": [{"name": "A"}]}],
            "engine_sim": {"port": 0, "step_base_ms": 0.5, "shutdown_grace_s": 0.2},
        }
    )
    stop = asyncio.Event()
    service = asyncio.create_task(run(config, stop))
    try:
        await wait_until(lambda: "engine_sim ready" in caplog.text, message="the ready line")
        match = re.search(r"engine_sim ready on (http://\S+)", caplog.text)
        assert match is not None
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{match[1]}/health") as response:
                assert response.status == 200
            body = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True}
            async with http.post(f"{match[1]}/v1/completions", json=body) as response:
                assert (await response.json())["usage"]["completion_tokens"] == 3
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=5)
    assert service.result() is None
