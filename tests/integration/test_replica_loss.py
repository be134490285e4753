"""Integration, real servers on port 0 in one process: a replica group of two emulators (budgets
16 and 16; tenant A's group floor 8, 4 on each), a control plane, one gateway and a telemetry
agent watching both engines, under load. When one replica's engine stops, the agent's reports
say its scrape fails; once that held controlplane.replica_loss.lost_after_s, the survivor takes
A's whole group floor (its limit grows from 4 to 8) through a decision naming the lost replica;
when the engine comes back (on its port) and has answered for back_after_s, the division is
restored. No engine ever holds more than its own budget, and no pool's limits sum above it."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

import openai
import pytest

from engine_sim.server import EngineSim
from slotshift.config import SlotshiftConfig, parse_config
from telemetry_agent.agent import TelemetryAgent
from tests.integration.stack import Fleet, NoGpu, start_fleet
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY_A = "sk-loss-tenant-a-4d19e2"
KEY_B = "sk-loss-tenant-b-90c3aa"
MODEL = "small"
POOLS = {"small-a": MODEL, "small-b": MODEL}
BUDGET = 16
LOST_AFTER_S = 1.0
BACK_AFTER_S = 2.0
AGENT_INTERVAL_S = 0.2
CHECK_INTERVAL_S = 0.1
SLACK_S = 2.0
"""Beyond the signal's own times: a report in flight, a decision, a loaded shared machine."""


def _config(urls: dict[str, str], grpc_port: int) -> SlotshiftConfig:
    # Before the engines start their URLs are one placeholder, which the agent's engines may
    # not share: the agent is configured once they are known.
    engines = [{"pool": pool, "metrics_url": f"{urls[pool]}/metrics", "gpus": []} for pool in POOLS]
    known = len(set(urls.values())) == len(urls)
    return parse_config(
        {
            "replica_groups": [
                {
                    "name": "small",
                    "tenants": [
                        # A's nominal share (4 of 16 by weight 1 : 3) is its floor part: the
                        # floor binds, so its limit shows where the floor went.
                        {"name": "A", "api_keys": [KEY_A], "weight": 1, "floor_slots": 8},
                        {"name": "B", "api_keys": [KEY_B], "weight": 3, "floor_slots": 2},
                    ],
                }
            ],
            "pools": [
                {
                    "name": pool,
                    "replica_group": "small",
                    "models": [MODEL],
                    "budget_slots": BUDGET,
                    "policy": "static",
                    "engine_url": urls[pool],
                }
                for pool in POOLS
            ],
            "controlplane": {
                "grpc_port": grpc_port,
                "metrics_port": 0,
                "replica_loss": {
                    "lost_after_s": LOST_AFTER_S,
                    "back_after_s": BACK_AFTER_S,
                    "check_interval_s": CHECK_INTERVAL_S,
                },
            },
            "gateway": {
                "pools": list(POOLS),
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "report_interval_s": 0.05,
            },
            "agent": {
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "metrics_port": 0,
                "interval_s": AGENT_INTERVAL_S,
                "scrape_timeout_s": 0.5,
                "engines": engines if known else [],
            },
            "engine_sim": {"port": 0},
        }
    )


def _floor_and_limit(fleet: Fleet, pool: str) -> tuple[int, int]:
    state = fleet.control_plane.pools[pool]
    floor = next(t.floor_slots for t in state.pool.tenants if t.name == "A")
    return floor, state.allocation.tenant_limits["A"]


async def _timed(condition: Callable[[], bool], timeout_s: float, message: str) -> float:
    began = time.monotonic()
    await wait_until(condition, timeout_s=timeout_s, message=message)
    return time.monotonic() - began


async def test_a_lost_replicas_floor_goes_to_the_survivor_and_comes_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with AsyncExitStack() as exits:
        fleet = await start_fleet(exits, _config, POOLS)
        agent = TelemetryAgent(fleet.config.agent, gpu_reader=NoGpu())
        await agent.start()
        exits.push_async_callback(agent.stop)

        def started(pool: str) -> bool:
            reporting = fleet.control_plane.pools[pool].telemetry is not None
            return reporting and _floor_and_limit(fleet, pool) == (4, 4)

        for pool in POOLS:
            await wait_until(
                functools.partial(started, pool),
                message=f"{pool}: A's floor part and limit 4, the agent reporting",
            )
        over_budget: list[str] = []
        stop = asyncio.Event()

        async def watch_budgets() -> None:
            gateway = fleet.gateways[0]
            while not stop.is_set():
                for pool in POOLS:
                    decided = fleet.control_plane.pools[pool].allocation.tenant_limits
                    enforced = sum(
                        s.admission.limit_slots for s in gateway.states[pool].tenants.values()
                    )
                    if sum(decided.values()) > BUDGET or enforced > BUDGET:
                        over_budget.append(f"{pool}: {dict(decided)}, enforced {enforced}")
                await asyncio.sleep(0.01)

        async def user(client: openai.AsyncOpenAI) -> None:
            while not stop.is_set():
                try:
                    await client.completions.create(
                        model=MODEL, prompt="hi", max_tokens=8, extra_body={"ignore_eos": True}
                    )
                except openai.APIStatusError:
                    await asyncio.sleep(0.05)  # a request on the lost engine: 502, expected

        url = fleet.gateways[0].url + "/v1"
        async with (
            openai.AsyncOpenAI(base_url=url, api_key=KEY_A, max_retries=0) as a,
            openai.AsyncOpenAI(base_url=url, api_key=KEY_B, max_retries=0) as b,
            asyncio.TaskGroup() as tasks,
        ):
            tasks.create_task(watch_budgets(), name="watch-budgets")
            for index in range(8):
                tasks.create_task(user(a if index % 2 else b), name=f"user-{index}")
            await wait_until(
                lambda: all(e.completed_count > 0 for e in fleet.engines.values()),
                message="both replicas serving",
            )

            lost_engine = fleet.engines["small-a"]
            port = int(lost_engine.url.rsplit(":", 1)[1])
            await lost_engine.stop()
            lost_s = await _timed(
                lambda: _floor_and_limit(fleet, "small-b") == (8, 8),
                LOST_AFTER_S + AGENT_INTERVAL_S + CHECK_INTERVAL_S + SLACK_S,
                "the survivor holding A's group floor",
            )
            survivor = fleet.control_plane.pools["small-b"]
            assert any("replica small-a lost" in d.trigger for d in survivor.decisions.newest(8))
            assert _floor_and_limit(fleet, "small-a") == (4, 4), "the lost member keeps its own"

            settings = fleet.config.engine_sim.model_copy(
                update={"model_name": MODEL, "port": port}
            )
            back_engine = EngineSim(settings)
            await back_engine.start()
            exits.push_async_callback(back_engine.stop)
            back_s = await _timed(
                lambda: _floor_and_limit(fleet, "small-b") == (4, 4),
                BACK_AFTER_S + AGENT_INTERVAL_S + CHECK_INTERVAL_S + SLACK_S,
                "the group's division restored",
            )
            assert any("replica small-a back" in d.trigger for d in survivor.decisions.newest(8))
            stop.set()
        with capsys.disabled():
            print(
                f"\nreplica lost -> survivor's floor 8: {lost_s:.2f} s; back -> 4: {back_s:.2f} s"
            )
        assert not over_budget, over_budget[:3]
        engines = {**fleet.engines, "small-a (back)": back_engine}
        for name, engine in engines.items():
            assert engine.peak_in_server <= BUDGET, f"{name} held more than its budget"
