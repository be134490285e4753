"""Integration, real servers on port 0 in one process: two emulators serving one model as two
pools (replicas) and a third serving another model, behind one gateway. When one replica's
engine goes away under load, the gateway routes that model's requests to the other replica
(only requests that were on the lost engine, or reached for it first, fail: 502 where the
connection failed, the engine's own 503 where it aborted them as it shut down), and no request of
the other model fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import openai
import pytest

from slotshift.config import SlotshiftConfig, parse_config
from tests.integration.stack import Fleet, start_fleet
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY = "sk-failover-tenant-a-51c0e2"
SMALL = "small"
LARGE = "large"
POOLS = {"small-a": SMALL, "small-b": SMALL, "large": LARGE}


def _config(urls: dict[str, str], grpc_port: int) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": pool,
                    "models": [model],
                    "budget_slots": 8,
                    "engine_url": urls[pool],
                    "tenants": [{"name": "A", "api_keys": [KEY]}],
                }
                for pool, model in POOLS.items()
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "gateway": {
                "pools": list(POOLS),
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "report_interval_s": 0.05,
                "replica_down_s": 30.0,
            },
            "engine_sim": {"port": 0},
        }
    )


ENGINE_STOPPED = "503 from the stopping engine"


def _failure(exc: openai.APIStatusError) -> str:
    """The status, and for a 503 whether the engine said it (its shutdown aborts what it holds)
    rather than the gateway (no slot in time), which would be a routing failure."""
    message = str(exc.message)
    if exc.status_code == 503 and ("shutting down" in message or "aborted" in message):
        return ENGINE_STOPPED
    return str(exc.status_code)


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with AsyncExitStack() as exits:
        yield await start_fleet(exits, _config, POOLS)


async def test_a_lost_replica_is_routed_around_and_the_other_model_never_fails(
    fleet: Fleet,
) -> None:
    outcomes: dict[str, list[str]] = {SMALL: [], LARGE: []}
    stop = asyncio.Event()

    async def user(client: openai.AsyncOpenAI, model: str) -> None:
        while not stop.is_set():
            try:
                await client.completions.create(
                    model=model, prompt="hi", max_tokens=8, extra_body={"ignore_eos": True}
                )
                outcomes[model].append("ok")
            except openai.APIStatusError as exc:
                outcomes[model].append(_failure(exc))

    async with (
        openai.AsyncOpenAI(
            base_url=fleet.gateways[0].url + "/v1", api_key=KEY, max_retries=0
        ) as client,
        asyncio.TaskGroup() as users,
    ):
        for index in range(6):
            users.create_task(user(client, (SMALL, LARGE)[index % 2]), name=f"user-{index}")
        await wait_until(lambda: len(outcomes[SMALL]) >= 20, message="load on both replicas")
        served = fleet.engines["small-a"].completed_count
        assert served > 0 and fleet.engines["small-b"].completed_count > 0
        await fleet.engines["small-a"].stop()
        lost_at = len(outcomes[SMALL])
        await wait_until(
            lambda: outcomes[SMALL][lost_at:].count("ok") >= 30, message="the other replica"
        )
        stop.set()
    assert set(outcomes[LARGE]) == {"ok"}, "the other model's requests never fail"
    failed = [o for o in outcomes[SMALL] if o != "ok"]
    assert set(failed) <= {"502", ENGINE_STOPPED}
    assert len(failed) <= 3, "only requests on the lost engine, or reaching for it first"
    after = outcomes[SMALL][lost_at + len(failed) :]
    assert after and set(after[-20:]) == {"ok"}
