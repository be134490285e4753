"""The agent policy in a running control plane, asking the emulator's scripted chat endpoint:
valid answers are published, anything else falls back (counted, logged, recorded), and the loop
never waits past the deadline."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from controlplane.server import ControlPlane
from engine_sim.server import EngineSim
from slotshift.config import EngineSimConfig, parse_config
from slotshift.v1 import query_pb2, query_pb2_grpc
from tests.stream_tokens import StreamTokens
from tests.support import wait_until

DEADLINE_MS = 200.0


@pytest.fixture
async def engine() -> AsyncIterator[EngineSim]:
    sim = EngineSim(EngineSimConfig(port=0))
    await sim.start()
    try:
        yield sim
    finally:
        await sim.stop()


@pytest.fixture
async def control_plane(engine: EngineSim, tmp_path: Path) -> AsyncIterator[ControlPlane]:
    config = parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 96,
                    "policy": "agent",
                    "decision_period_s": 0.1,
                    "agent_policy": {
                        "url": f"{engine.url}/v1",
                        "deadline_ms": DEADLINE_MS,
                        "fallback": "static",
                    },
                    "tenants": [{"name": "A", "floor_slots": 4}, {"name": "B", "floor_slots": 4}],
                }
            ],
            "controlplane": {"grpc_port": 0, "metrics_port": 0},
        }
    )
    server = ControlPlane(StreamTokens.write(tmp_path).apply(config))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _script(engine: EngineSim, replies: list[dict[str, object]]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/sim/chat-script", json={"replies": replies}) as response,
    ):
        assert response.status == 200


async def _decisions(control_plane: ControlPlane, limit: int = 50) -> list[query_pb2.Decision]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.grpc_port}") as channel:
        stub = query_pb2_grpc.AllocationServiceStub(channel)
        reply = await stub.GetDecisions(query_pb2.GetDecisionsRequest(pool="default", limit=limit))
        return list(reply.decisions)


async def test_valid_answers_are_published_and_bad_ones_fall_back(
    engine: EngineSim, control_plane: ControlPlane
) -> None:
    good: dict[str, object] = {
        "content": json.dumps({"limits": {"A": 20, "B": 76}, "reason": "B is busy"})
    }
    await _script(
        engine,
        [
            good,
            {"content": json.dumps({"limits": {"A": 90, "B": 90}, "reason": "greedy"})},
            {"content": "{}", "delay_ms": 2000},
            {"content": "busy", "status": 500},
            {"content": "A should get more slots."},
        ],
    )
    state = control_plane.pools["default"]

    async def saw_every_kind() -> bool:
        fallbacks = {
            d.fallback.split(":")[0] for d in await _decisions(control_plane) if d.fallback
        }
        return {"invalid", "late", "failed", "unparseable"} <= fallbacks

    await wait_until(saw_every_kind, timeout_s=10, message="every kind of fallback")
    decisions = await _decisions(control_plane)
    used = [d for d in decisions if not d.fallback and d.reason.startswith("agent")]
    assert used, "the valid answer was used"
    assert {o.tenant: o.limit_slots for o in used[-1].outputs} == {"A": 20, "B": 76}
    for decision in decisions:
        assert sum(o.limit_slots for o in decision.outputs) == 96
        if decision.fallback:
            assert decision.reason.startswith("fell back to static")
            assert decision.duration_ms < DEADLINE_MS
    late = next(d for d in decisions if d.fallback.startswith("late"))
    assert "200 ms" in late.fallback
    # With the script used up, the emulator generates text, too slowly: late, fall back.
    await wait_until(
        lambda: state.allocation.tenant_limits == {"A": 48, "B": 48},
        message="the static fallback's limits",
    )
    samples = {
        sample.labels["kind"]: sample.value
        for family in control_plane.metrics.registry.collect()
        if family.name == "slotshift_controlplane_policy_fallbacks"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert {"invalid", "late", "failed", "unparseable"} <= set(samples)


async def test_the_loop_never_waits_past_the_deadline(
    engine: EngineSim, control_plane: ControlPlane
) -> None:
    await _script(engine, [{"content": "{}", "delay_ms": 5000} for _ in range(5)])
    loop = control_plane.runtimes["default"].loop
    started = time.monotonic()
    record = await loop.decide()
    elapsed_ms = (time.monotonic() - started) * 1000
    assert record.fallback is not None
    assert record.fallback.startswith("late")
    assert elapsed_ms < DEADLINE_MS + 150
