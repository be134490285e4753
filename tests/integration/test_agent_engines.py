"""Integration, real servers on port 0 in one process: one agent, started through its service
entry (telemetry_agent.main.run), watches two emulated engines of two pools on a node of two
GPUs, and the control plane keeps each pool's telemetry apart.

NVML is faked at the pynvml boundary (tests/unit/telemetry_agent/fake_pynvml.py): everything
above it, the agent's NVML reader included, is the real code. The two GPUs are told apart by
their utilisation (20 % and 90 %), the two engines by their load (one request held running in
the engine of `code`, none in `chat`'s): a blend would show as 55 %, or as a request in both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp
import grpc
import pytest

from controlplane.server import ControlPlane
from engine_sim.server import EngineSim
from slotshift.config import EngineSimConfig, SlotshiftConfig, parse_config
from slotshift.v1 import query_pb2, query_pb2_grpc
from telemetry_agent.agent import TelemetryAgent
from telemetry_agent.main import run
from tests.stream_tokens import StreamTokens
from tests.support import wait_until
from tests.unit.telemetry_agent.fake_pynvml import FakeGpu, FakePynvml

pytestmark = pytest.mark.integration

CHAT_GPU = FakeGpu(uuid="GPU-5b3a9c1e-2f4d-4e6a-9b7c-0d1e2f3a4b5c", utilization_pct=20)
CODE_GPU = FakeGpu(uuid="GPU-0c8e1d2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f", utilization_pct=90)
AGENT_ID = "gpu-node-1"


@dataclass
class Node:
    engines: dict[str, EngineSim]
    control_plane: ControlPlane
    config: SlotshiftConfig


def _config(engine_urls: dict[str, str], grpc_port: int) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": pool,
                    "budget_slots": 8,
                    "policy": "demand",
                    "decision_period_s": 0.1,
                    "engine_url": url,
                    "tenants": [{"name": "A", "floor_slots": 1}, {"name": "B", "floor_slots": 1}],
                }
                for pool, url in engine_urls.items()
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "agent": {
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "metrics_port": 0,
                "interval_s": 0.05,
                "reconnect_initial_s": 0.05,
                "reconnect_max_s": 0.2,
                # Listed in the other order than the GPUs: selection is by UUID, not position.
                "engines": [
                    {
                        "pool": "code",
                        "metrics_url": f"{engine_urls['code']}/metrics",
                        "gpus": [CODE_GPU.uuid],
                    },
                    {
                        "pool": "chat",
                        "metrics_url": f"{engine_urls['chat']}/metrics",
                        "gpus": [CHAT_GPU.uuid],
                    },
                ],
            },
        }
    )


@pytest.fixture
async def node(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Node]:
    FakePynvml([CHAT_GPU, CODE_GPU]).install(monkeypatch)
    async with AsyncExitStack() as exits:
        engines = {}
        for pool in ("chat", "code"):
            # Slow steps, so that a request stays running for the whole test.
            engine = EngineSim(EngineSimConfig(port=0, step_base_ms=50.0))
            await engine.start()
            exits.push_async_callback(engine.stop)
            engines[pool] = engine
        urls = {pool: engine.url for pool, engine in engines.items()}
        tokens = StreamTokens.for_stack(exits)
        control_plane = ControlPlane(tokens.apply(_config(urls, 0)))
        await control_plane.start()
        exits.push_async_callback(control_plane.stop)
        config = tokens.apply(_config(urls, control_plane.grpc_port))
        stop = asyncio.Event()
        agent = asyncio.create_task(run(config, stop, agent_id=AGENT_ID), name="agent-under-test")

        async def stop_agent() -> None:
            stop.set()
            await asyncio.wait_for(agent, timeout=10)

        exits.push_async_callback(stop_agent)
        yield Node(engines, control_plane, config)


async def _decisions(node: Node, pool: str) -> list[query_pb2.Decision]:
    target = f"127.0.0.1:{node.control_plane.grpc_port}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = query_pb2_grpc.AllocationServiceStub(channel)
        reply = await stub.GetDecisions(query_pb2.GetDecisionsRequest(pool=pool, limit=20))
        return list(reply.decisions)


async def test_each_pool_holds_its_own_engines_and_gpus_figures_and_decides_on_them(
    node: Node,
) -> None:
    pools = node.control_plane.pools
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{node.engines['code'].url}/v1/chat/completions",
            json={
                "model": "Qwen/Qwen2.5-3B-Instruct",
                "messages": [{"role": "user", "content": "count to a thousand"}],
                "max_tokens": 2000,
                "stream": True,
            },
        ) as held,
    ):
        assert held.status == 200
        await held.content.readline()  # the first chunk: the request runs in the engine

        def code_running() -> bool:
            # Each engine's figures come on a stream of their own: chat's may come after code's.
            record = pools["code"].telemetry
            return (
                record is not None
                and record.num_requests_running >= 1
                and pools["chat"].telemetry is not None
            )

        await wait_until(code_running, message="chat's figures, and the running request in code's")
        chat, code = pools["chat"].telemetry, pools["code"].telemetry
        assert chat is not None
        assert code is not None

        async def decided_on_fresh_figures() -> bool:
            for pool, expected in (("chat", 0), ("code", 1)):
                used = [
                    d.telemetry
                    for d in await _decisions(node, pool)
                    if d.telemetry.fresh and d.telemetry.gpu_available
                ]
                if not any(t.num_requests_running == expected for t in used):
                    return False
            return True

        await wait_until(decided_on_fresh_figures, message="each pool deciding on its figures")
        decisions = {pool: await _decisions(node, pool) for pool in ("chat", "code")}

    assert (chat.agent_id, code.agent_id) == (AGENT_ID, AGENT_ID)
    assert (chat.gpu_available, code.gpu_available) == (True, True)
    assert (chat.gpu_emulated, code.gpu_emulated) == (False, False)
    assert chat.gpu_utilization_pct == 20.0
    assert code.gpu_utilization_pct == 90.0
    assert chat.num_requests_running == 0
    assert code.num_requests_running == 1
    for pool, utilization_pct, running in (("chat", 20.0, 0), ("code", 90.0, 1)):
        used = [d.telemetry for d in decisions[pool] if d.telemetry.gpu_available]
        assert used, pool
        assert all(t.gpu_utilization_pct == utilization_pct for t in used), pool
        assert all(not t.gpu_emulated for t in used), pool
        assert any(t.num_requests_running == running for t in used if t.fresh), pool


async def test_a_pool_the_control_plane_refuses_cuts_no_other_pools_telemetry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakePynvml([CHAT_GPU, CODE_GPU]).install(monkeypatch)
    async with AsyncExitStack() as exits:
        engine = EngineSim(EngineSimConfig(port=0))
        await engine.start()
        exits.push_async_callback(engine.stop)
        # The control plane knows `chat` only; the agent's config also names `code` (a control
        # plane lagging behind a new pool): each report of `code` ends its stream with NOT_FOUND.
        only_chat = parse_config(
            {
                "pools": [
                    {"name": "chat", "budget_slots": 8, "tenants": [{"name": "A"}]},
                ],
                "controlplane": {"grpc_port": 0, "metrics_port": 0},
            }
        )
        tokens = StreamTokens.for_stack(exits)
        control_plane = ControlPlane(tokens.apply(only_chat))
        await control_plane.start()
        exits.push_async_callback(control_plane.stop)
        agent_config = tokens.apply(
            _config(
                {"chat": engine.url, "code": engine.url.replace("127.0.0.1", "localhost")},
                control_plane.grpc_port,
            )
        ).agent
        agent = TelemetryAgent(agent_config, agent_id=AGENT_ID)
        await agent.start()
        exits.push_async_callback(agent.stop)
        state = control_plane.pools["chat"]
        await wait_until(lambda: state.telemetry is not None, message="chat's first report")
        assert state.telemetry is not None
        first = state.telemetry.received_at_s
        await wait_until(
            lambda: (
                (
                    agent.metrics.registry.get_sample_value(
                        "slotshift_agent_reports_sent_total", {"pool": "code"}
                    )
                    or 0
                )
                >= 3
            ),
            message="code's reports sent and refused",
        )
        await wait_until(
            lambda: state.telemetry is not None and state.telemetry.received_at_s > first + 0.3,
            message="chat's reports arriving on meanwhile",
        )
        assert agent.stream_connected("chat")
        assert state.telemetry.gpu_utilization_pct == CHAT_GPU.utilization_pct
