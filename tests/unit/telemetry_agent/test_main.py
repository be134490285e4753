"""The service entry point: ready line, clean stop, and a pool the config does not know."""

from __future__ import annotations

import asyncio
import logging

import pytest

from slotshift.config import ConfigError, SlotshiftConfig, parse_config
from telemetry_agent.main import run
from tests.support import free_port, wait_until


def config(pool: str = "pool-a") -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [{"name": "pool-a", "budget_slots": 4, "tenants": [{"name": "t1"}]}],
            "agent": {
                "pool": pool,
                "controlplane_target": f"127.0.0.1:{free_port()}",
                "engine_metrics_url": f"http://127.0.0.1:{free_port()}/metrics",
                "interval_s": 0.02,
                "reconnect_initial_s": 0.02,
                "reconnect_max_s": 0.1,
                "metrics_port": 0,
            },
        }
    )


async def test_run_logs_ready_and_stops_when_told(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="telemetry_agent.main"):
        service = asyncio.create_task(run(config(), stop, agent_id="node-3"))
        await wait_until(
            lambda: any("telemetry_agent ready" in r.getMessage() for r in caplog.records),
            message="the ready line",
        )
        stop.set()
        await asyncio.wait_for(service, timeout=5)
    ready = next(r.getMessage() for r in caplog.records if "ready" in r.getMessage())
    assert "node-3" in ready
    assert "pool-a" in ready
    assert "/metrics" in ready
    assert any("telemetry_agent stopped" in r.getMessage() for r in caplog.records)


async def test_run_refuses_a_pool_that_is_not_configured() -> None:
    with pytest.raises(ConfigError, match="pool-b"):
        await run(config(pool="pool-b"), asyncio.Event())
