"""Integration, real servers on port 0 in one process: an emulator that requires an API key (as
vLLM with --api-key), a control plane, a gateway that holds the key (pools[].engine_api_key_file)
and an agent that scrapes the engine's /metrics without it.

- the tenants' requests pass through the gateway, streamed or not, a preemptible tenant's
  resumable request (its /tokenize call and its stream) included, and /v1/models;
- the engine called around the gateway, without the key or with a tenant's key, answers 401;
- the agent's scrape of /metrics needs no key: its engine figures reach the control plane;
- a gateway with a key the engine does not take fails requests with 502, never the engine's 401.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from admission_gateway.gateway import AdmissionGateway
from slotshift.config import SlotshiftConfig, parse_config
from telemetry_agent.agent import TelemetryAgent
from tests.integration.stack import NoGpu, Stack, start_stack
from tests.support import wait_until

pytestmark = pytest.mark.integration

ENGINE_KEY = "sk-engine-integration-key-93b2"
KEY_A = "sk-engine-test-tenant-a-1c4d"
KEY_BATCH = "sk-engine-test-tenant-batch-7e20"
MODEL = "Qwen/Qwen2.5-3B-Instruct"


def _config(engine_url: str, grpc_port: int, *, folder: Path, gateway_key: Path) -> SlotshiftConfig:
    engine_keys = folder / "engine-api-key"
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 8,
                    "decision_period_s": 0.1,
                    "engine_url": engine_url,
                    "engine_api_key_file": str(gateway_key),
                    "tenants": [
                        {"name": "A", "api_keys": [KEY_A]},
                        {"name": "batch", "api_keys": [KEY_BATCH], "preemptible": True},
                    ],
                }
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "fallback_replicas": 1,
                "report_interval_s": 0.05,
            },
            "agent": {
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "engine_metrics_url": f"{engine_url}/metrics",
                "metrics_port": 0,
                "interval_s": 0.1,
            },
            "engine_sim": {
                "port": 0,
                "api_key_file": str(engine_keys),
                "step_base_ms": 0.5,
                "pseudo_eos_max_tokens": 16,
            },
        }
    )


@dataclass
class KeyedStack:
    stack: Stack
    folder: Path

    @property
    def gateway(self) -> AdmissionGateway:
        return self.stack.gateways[0]


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[KeyedStack]:
    (tmp_path / "engine-api-key").write_text(ENGINE_KEY + "\n")
    async with AsyncExitStack() as exits:
        stack = await start_stack(
            exits,
            lambda url, port: _config(
                url, port, folder=tmp_path, gateway_key=tmp_path / "engine-api-key"
            ),
            gateways=1,
        )
        agent = TelemetryAgent(stack.config.agent, gpu_reader=NoGpu())
        await agent.start()
        exits.push_async_callback(agent.stop)
        yield KeyedStack(stack, tmp_path)


async def _request(
    session: aiohttp.ClientSession,
    url: str,
    key: str | None,
    payload: dict[str, Any] | None = None,
) -> tuple[int, bytes]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    if payload is None:
        async with session.get(url, headers=headers) as response:
            return response.status, await response.read()
    async with session.post(url, json=payload, headers=headers) as response:
        return response.status, await response.read()


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
STREAMED = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "stream": True}
# A preemptible tenant's text completion: resumable, so the gateway asks the engine's /tokenize
# for its ids and streams it upstream.
RESUMABLE = {"model": MODEL, "prompt": "Hello there", "max_tokens": 6}


async def test_requests_pass_through_the_gateway_that_holds_the_key(keyed: KeyedStack) -> None:
    gateway = keyed.gateway
    base = gateway.url
    async with aiohttp.ClientSession() as session:
        chat = await _request(session, f"{base}/v1/chat/completions", KEY_A, CHAT)
        streamed = await _request(session, f"{base}/v1/completions", KEY_A, STREAMED)
        resumed = await _request(session, f"{base}/v1/completions", KEY_BATCH, RESUMABLE)
        models = await _request(session, f"{base}/v1/models", KEY_A)
    assert [chat[0], streamed[0], resumed[0], models[0]] == [200, 200, 200, 200]
    assert b"data: [DONE]" in streamed[1]
    assert json.loads(resumed[1])["usage"]["completion_tokens"] >= 1
    assert json.loads(models[1])["data"][0]["id"] == MODEL
    assert gateway.admission("batch").completed_total == 1
    assert keyed.stack.engine.completed_count == 3


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(None, id="no-key"),
        # A tenant's key is the gateway's business; the engine takes only its own.
        pytest.param(KEY_A, id="tenant-key"),
    ],
)
async def test_the_engine_called_around_the_gateway_refuses(
    keyed: KeyedStack, key: str | None
) -> None:
    engine = keyed.stack.engine.url
    async with aiohttp.ClientSession() as session:
        chat = await _request(session, f"{engine}/v1/chat/completions", key, CHAT)
        models = await _request(session, f"{engine}/v1/models", key)
        # With the key, the same call is served: the 401 is the key's, not the route's.
        served = await _request(session, f"{engine}/v1/chat/completions", ENGINE_KEY, CHAT)
    assert chat == models == (401, b'{"error":"Unauthorized"}')
    assert served[0] == 200


async def test_the_agent_scrapes_the_engines_metrics_without_the_key(keyed: KeyedStack) -> None:
    state = keyed.stack.control_plane.pools["default"]
    async with aiohttp.ClientSession() as session:
        status, text = await _request(session, f"{keyed.stack.engine.url}/metrics", None)
        assert status == 200
        assert b"vllm:num_requests_running" in text
        # A request held running in the engine shows in the agent's figures at the control plane.
        async with session.post(
            f"{keyed.gateway.url}/v1/completions",
            json={"model": MODEL, "prompt": "Hi", "max_tokens": 20000, "ignore_eos": True,
                  "stream": True},
            headers={"Authorization": f"Bearer {KEY_A}"},
        ) as held:  # fmt: skip
            assert held.status == 200
            await held.content.readline()
            await wait_until(
                lambda: state.telemetry is not None and state.telemetry.num_requests_running >= 1,
                message="the running request in the agent's telemetry",
            )


async def test_a_gateway_whose_key_the_engine_does_not_take_answers_502(
    keyed: KeyedStack, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = keyed.folder / "wrong-engine-key"
    wrong.write_text("sk-not-the-engines-key-0000\n")
    config = _config(
        keyed.stack.engine.url,
        keyed.stack.control_plane.grpc_port,
        folder=keyed.folder,
        gateway_key=wrong,
    )
    gateway = AdmissionGateway(config, gateway_id="gw-wrong-key")
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await _request(
                session, f"{gateway.url}/v1/chat/completions", KEY_A, CHAT
            )
    finally:
        await gateway.stop()
    assert status == 502
    assert json.loads(body)["error"]["code"] == "upstream_unavailable"
    assert any("engine_api_key_file" in r.getMessage() for r in caplog.records)
