"""Integration, real servers on port 0 in one process: with `metrics_token_file` set, each
service's Prometheus /metrics (control plane, gateway, agent) answers 401 without the token,
and its figures with it; /health stays open."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest

from slotshift.config import SlotshiftConfig, parse_config
from telemetry_agent.agent import TelemetryAgent
from tests.integration.stack import NoGpu, start_stack

pytestmark = pytest.mark.integration

TOKEN = "metrics-token-6d1f0b"


def _config(engine_url: str, grpc_port: int, token_file: Path) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 4,
                    "engine_url": engine_url,
                    "tenants": [{"name": "A", "api_keys": ["key-a"]}],
                }
            ],
            "controlplane": {
                "grpc_port": grpc_port,
                "metrics_port": 0,
                "metrics_token_file": str(token_file),
            },
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "metrics_token_file": str(token_file),
            },
            "agent": {
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "engine_metrics_url": f"{engine_url}/metrics",
                "metrics_port": 0,
                "metrics_token_file": str(token_file),
            },
            "engine_sim": {"port": 0},
        }
    )


@pytest.fixture
async def metrics_urls(tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    token_file = tmp_path / "metrics-token"
    token_file.write_text(f"# Prometheus sends it\n{TOKEN}\n")
    async with AsyncExitStack() as exits:
        stack = await start_stack(
            exits, lambda url, port: _config(url, port, token_file), gateways=1
        )
        agent = TelemetryAgent(stack.config.agent, gpu_reader=NoGpu())
        await agent.start()
        exits.push_async_callback(agent.stop)
        yield {
            "controlplane": f"http://127.0.0.1:{stack.control_plane.metrics_port}",
            "gateway": stack.gateways[0].url,
            "agent": f"http://127.0.0.1:{agent.metrics_port}",
        }


async def test_every_metrics_endpoint_needs_the_token(metrics_urls: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as session:
        for service, url in metrics_urls.items():
            for headers, status in (
                ({}, 401),
                ({"Authorization": "Bearer wrong-token"}, 401),
                ({"Authorization": f"Bearer {TOKEN}"}, 200),
            ):
                async with session.get(f"{url}/metrics", headers=headers) as response:
                    body = await response.text()
                    assert response.status == status, (service, headers, body)
                    if status == 200:
                        assert "slotshift_" in body, service
                    else:
                        assert "slotshift_" not in body
                        assert response.headers["WWW-Authenticate"].startswith("Bearer")
            async with session.get(f"{url}/health") as response:
                assert response.status == 200, f"{service}: /health stays open"
