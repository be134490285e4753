"""Integration, real servers on port 0 in one process: the emulator, the control plane and three
gateways. A preemptible batch tenant borrows the whole budget; when the lender bursts, the
control plane has the borrower's youngest work paused at every gateway that holds it, the lender
runs long before the borrower's answers would have ended, the engine never holds more than the
budget, and every paused answer completes with exactly the tokens it asked for."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from slotshift.config import SlotshiftConfig, parse_config
from tests.integration.stack import Stack, start_stack
from tests.support import wait_until

BUDGET = 24
B_TOKENS = 400
"""B's answers: at the emulator's >= 15 ms a step, each takes 6 s or more."""


def _config(engine_url: str, grpc_port: int) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": BUDGET,
                    "policy": "slo",
                    "decision_period_s": 0.5,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                        {
                            "name": "B",
                            "api_keys": ["key-b"],
                            "floor_slots": 2,
                            "preemptible": True,
                        },
                    ],
                }
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0, "gateway_lease_ttl_s": 0.5},
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "fallback_replicas": 3,
                "report_interval_s": 0.05,
            },
            "engine_sim": {
                "port": 0,
                "enable_prompt_tokens_details": True,
                "step_base_ms": 15.0,
            },
        }
    )


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield await start_stack(exits, _config)


async def _stream(
    session: aiohttp.ClientSession, url: str, key: str, max_tokens: int
) -> tuple[int, int, int]:
    """One streamed completion; (status, text chunks, usage's completion_tokens)."""
    payload = {
        "model": "Qwen/Qwen2.5-3B-Instruct",
        "prompt": "the batch job summarises a long report",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = completion_tokens = 0
    async with session.post(
        f"{url}/v1/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        if response.status != 200:
            return response.status, 0, 0
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[len(b"data: ") :])
            chunks += sum(1 for c in event["choices"] if c.get("text"))
            if event.get("usage"):
                completion_tokens = event["usage"]["completion_tokens"]
    return 200, chunks, completion_tokens


async def test_a_lender_runs_at_once_while_the_borrowers_work_pauses_and_resumes(
    stack: Stack,
) -> None:
    engine, control_plane, gateways = stack.engine, stack.control_plane, stack.gateways
    state = control_plane.pools["default"]
    await wait_until(lambda: state.gateways_connected == 3, message="three gateways connected")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        borrowers = [
            asyncio.create_task(_stream(session, g.url, "key-b", B_TOKENS), name=f"b-{i}")
            for i, g in enumerate(gateways * 12)
        ]
        await wait_until(
            lambda: engine.num_running >= BUDGET - 2, message="B borrows the whole budget"
        )
        engine.reset_peak()
        a_admission = gateways[0].state.tenants["A"].admission
        lenders = [
            asyncio.create_task(_stream(session, gateways[0].url, "key-a", 8), name=f"a-{i}")
            for i in range(8)
        ]
        lent_back = await asyncio.gather(*lenders)
        a_waits = a_admission.queue_wait.percentiles()
        results = await asyncio.gather(*borrowers)
    assert all(status == 200 for status, _, _ in lent_back + results)
    assert all(tokens == 8 for _, _, tokens in lent_back)
    assert all(chunks == B_TOKENS and tokens == B_TOKENS for _, chunks, tokens in results), (
        "every paused answer delivered exactly the tokens it asked for, each once"
    )
    pauses = sum(g.state.tenants["B"].admission.pauses_total for g in gateways)
    assert pauses > 0, "B's borrowed work was paused"
    # Without pausing, A's requests would wait for B's 6 s answers to end.
    assert a_waits.p99_ms < 3000.0, f"A waited {a_waits.p99_ms:.0f} ms for its share"
    assert engine.peak_in_server <= BUDGET
