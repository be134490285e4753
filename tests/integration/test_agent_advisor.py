"""The agent's advisor against the emulator's chat endpoint, scripted to answer well, late, badly
or not at all: it never waits past its deadline and every failure comes back as a reason."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from controlplane.agent_advisor import ChatAdvisor, answer_schema
from controlplane.core.snapshot import PoolSnapshot, TenantLoad
from engine_sim.server import EngineSim
from slotshift.config import AgentPolicyConfig, EngineSimConfig, PoolConfig, TenantConfig

POOL = PoolConfig(
    name="p",
    budget_slots=96,
    policy="agent",
    tenants=[TenantConfig(name="A", floor_slots=4), TenantConfig(name="B", floor_slots=4)],
)
SNAPSHOT = PoolSnapshot(
    now_s=0.0,
    tenants={"A": TenantLoad(queued=30), "B": TenantLoad(in_flight=60)},
    current_limits={"A": 48, "B": 48},
)
DEADLINE_MS = 300.0


@pytest.fixture
async def engine() -> AsyncIterator[EngineSim]:
    sim = EngineSim(EngineSimConfig(port=0))
    await sim.start()
    try:
        yield sim
    finally:
        await sim.stop()


@pytest.fixture
async def advisor(engine: EngineSim) -> AsyncIterator[ChatAdvisor]:
    settings = AgentPolicyConfig(url=f"{engine.url}/v1", deadline_ms=DEADLINE_MS)
    chat = ChatAdvisor(POOL, settings)
    try:
        yield chat
    finally:
        await chat.close()


async def _script(engine: EngineSim, *replies: dict[str, object]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/sim/chat-script", json={"replies": list(replies)}) as response,
    ):
        assert response.status == 200


async def test_a_valid_answer_comes_back_as_limits(engine: EngineSim, advisor: ChatAdvisor) -> None:
    answer = {"limits": {"A": 30, "B": 66}, "reason": "A is queueing"}
    await _script(engine, {"content": json.dumps(answer)})
    advice = await advisor.advise(SNAPSHOT)
    assert advice.error is None
    assert advice.limits == {"A": 30, "B": 66}
    assert advice.reason == "A is queueing"


async def test_fenced_json_is_accepted(engine: EngineSim, advisor: ChatAdvisor) -> None:
    await _script(
        engine, {"content": '```json\n{"limits": {"A": 10, "B": 86}, "reason": "r"}\n```'}
    )
    advice = await advisor.advise(SNAPSHOT)
    assert advice.limits == {"A": 10, "B": 86}


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        pytest.param({"content": "I think A should get more."}, "unparseable", id="prose"),
        pytest.param({"content": '{"reason": "no limits"}'}, "unparseable", id="no-limits"),
        pytest.param({"content": "overloaded", "status": 503}, "failed: HTTP 503", id="http-error"),
        pytest.param({"content": "{}", "delay_ms": 3000}, "late", id="late"),
    ],
)
async def test_failures_come_back_as_reasons_within_the_deadline(
    engine: EngineSim, advisor: ChatAdvisor, reply: dict[str, object], error: str
) -> None:
    await _script(engine, reply)
    started = time.monotonic()
    advice = await advisor.advise(SNAPSHOT)
    elapsed_ms = (time.monotonic() - started) * 1000
    assert advice.limits is None
    assert advice.error is not None
    assert advice.error.startswith(error)
    assert elapsed_ms < DEADLINE_MS + 200, "the advisor must not wait past its deadline"


async def test_unreachable_endpoint_fails_fast() -> None:
    chat = ChatAdvisor(
        POOL, AgentPolicyConfig(url="http://127.0.0.1:1/v1", deadline_ms=DEADLINE_MS)
    )
    try:
        advice = await chat.advise(SNAPSHOT)
    finally:
        await chat.close()
    assert advice.error is not None
    assert advice.error.startswith("failed:")


def test_the_schema_states_every_bound() -> None:
    schema = answer_schema(POOL)
    tenants = schema["properties"]["limits"]["properties"]
    assert tenants["A"] == {"type": "integer", "minimum": 4, "maximum": 96}
    assert schema["properties"]["limits"]["required"] == ["A", "B"]
