"""Integration, real servers on port 0 in one process: the emulator, the control plane and three
gateways under load from two tenants. The number of requests inside the engine never exceeds the
pool's budget, and every gateway acknowledges the latest allocation version."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from slotshift.config import SlotshiftConfig, parse_config
from tests.integration.stack import Stack, start_stack
from tests.support import wait_until

BUDGET = 24


def _config(engine_url: str, grpc_port: int, policy: str = "demand") -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": BUDGET,
                    "policy": policy,
                    "decision_period_s": 0.2,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                        {"name": "B", "api_keys": ["key-b"], "floor_slots": 2},
                    ],
                }
            ],
            # A short lease: the control plane grants nothing above what the gateways already
            # enforce for one lease after it starts, and this test wants the budget contended.
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0, "gateway_lease_ttl_s": 0.5},
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "fallback_replicas": 3,
                "report_interval_s": 0.05,
            },
            "engine_sim": {"port": 0},
        }
    )


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield await start_stack(exits, lambda url, port: _config(url, port, "demand"))


@pytest.fixture
async def static_stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield await start_stack(exits, lambda url, port: _config(url, port, "static"))


async def _closed_loop(
    session: aiohttp.ClientSession, url: str, key: str, until: float, tokens: int
) -> int:
    done = 0
    payload = {
        "model": "Qwen/Qwen2.5-3B-Instruct",
        "prompt": "hi",
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    while time.monotonic() < until:
        async with session.post(
            f"{url}/v1/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            await response.read()
            assert response.status == 200, await response.text()
            done += 1
    return done


async def test_engine_never_holds_more_than_the_budget_and_gateways_ack(stack: Stack) -> None:
    state = stack.control_plane.pools["default"]
    await wait_until(lambda: state.gateways_connected == 3, message="three gateways connected")
    samples: list[int] = []
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        while not stop_sampling.is_set():
            samples.append(stack.engine.num_running + stack.engine.num_waiting)
            await asyncio.sleep(0.002)

    until = time.monotonic() + 3.0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        sampler = asyncio.create_task(sample(), name="sample-engine")
        # B floods all three gateways from the start; A arrives later on one gateway only, so
        # slots must move between tenants and between gateways.
        b_workers = [
            _closed_loop(session, g.url, "key-b", until, 12)
            for g in stack.gateways
            for _ in range(15)
        ]

        async def a_later() -> list[int]:
            await asyncio.sleep(1.0)
            return list(
                await asyncio.gather(
                    *(
                        _closed_loop(session, stack.gateways[0].url, "key-a", until, 6)
                        for _ in range(20)
                    )
                )
            )

        a_task = asyncio.create_task(a_later(), name="tenant-a")
        b_done = await asyncio.gather(*b_workers)
        a_done = await a_task
        stop_sampling.set()
        await sampler

    assert sum(a_done) > 0
    assert sum(b_done) > 0
    assert len(samples) > 100
    assert max(samples) <= BUDGET, f"engine held {max(samples)} > budget {BUDGET}"
    assert stack.engine.peak_in_server <= BUDGET
    assert max(samples) >= BUDGET - 2, "the budget was not used: the test did not contend"

    # Applied at the gateway and acknowledged to the control plane are two moments: wait for
    # the acknowledgements too. A gateway whose part did not change keeps an older version, so
    # the test is that each enforces exactly its part and has acknowledged what it applied.
    def settled() -> bool:
        allocation = state.allocation
        acked = state.applied_versions()
        for gateway in stack.gateways:
            part = allocation.gateways.get(gateway.gateway_id, {})
            limits = {
                t: tenant.admission.limit_slots for t, tenant in gateway.state.tenants.items()
            }
            if limits != {t: lim.limit_slots for t, lim in part.items()}:
                return False
            if acked.get(gateway.gateway_id) != gateway.state.applied_version:
                return False
        return True

    await wait_until(settled, message="every gateway enforces its part and acknowledged it")
    allocation = state.allocation
    assert sum(allocation.tenant_limits.values()) == BUDGET
    assert set(allocation.gateways) == {"gw-0", "gw-1", "gw-2"}
    targets = [
        lim.target_slots for limits in allocation.gateways.values() for lim in limits.values()
    ]
    assert sum(targets) == BUDGET


async def test_a_tenant_busy_at_one_gateway_leaves_headroom_at_the_others(
    static_stack: Stack,
) -> None:
    """A's 12 slots: A runs 4 long requests through gw-0 only. gw-0 gets those 4 and a third of
    the other 8, and gw-1 and gw-2 keep the rest, so that A's next request is admitted at once
    wherever it arrives (split by demand alone, gw-1 and gw-2 would hold nothing of A's)."""
    stack = static_stack
    state = stack.control_plane.pools["default"]
    await wait_until(lambda: state.gateways_connected == 3, message="three gateways connected")
    assert state.allocation.tenant_limits["A"] == BUDGET // 2
    until = time.monotonic() + 60.0
    async with aiohttp.ClientSession() as session:
        running = [
            asyncio.create_task(
                _closed_loop(session, stack.gateways[0].url, "key-a", until, 2_000),
                name=f"tenant-a-{i}",
            )
            for i in range(4)
        ]
        try:
            admission = [g.state.tenants["A"].admission for g in stack.gateways]
            # Headroom 12 - 4 = 8, split 3, 3, 2 (ties go to the first gateways).
            await wait_until(
                lambda: [a.limit_slots for a in admission] == [4 + 3, 3, 2],
                timeout_s=10.0,
                message="A's limit split as demand plus an even part of the headroom",
            )
            assert [a.in_flight for a in admission] == [4, 0, 0]
            # A request of A through gw-2 is admitted without waiting.
            payload = {"model": "Qwen/Qwen2.5-3B-Instruct", "prompt": "hi", "max_tokens": 2}
            async with session.post(
                f"{stack.gateways[2].url}/v1/completions",
                json=payload,
                headers={"Authorization": "Bearer key-a"},
            ) as response:
                assert response.status == 200, await response.text()
            waited = admission[2].queue_wait.percentiles()
            assert waited.count == 1 and waited.p99_ms < 5.0
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
