"""Integration, real servers on port 0 in one process: a gateway in front of the emulator, in a
pool that weighs requests by the engine's /tokenize count (pools[].request_cost). Tenant A's long
prompts hold their size in slots, so tenant B's short ones keep their share of the engine; the
slots held, not the requests, stay within the budget at every instant."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from admission_gateway.gateway import AdmissionGateway
from admission_gateway.gateway_state import TenantLimit
from engine_sim.server import EngineSim
from engine_sim.tokens import text_token_ids
from slotshift.config import EngineSimConfig, SlotshiftConfig
from tests.support import wait_until

BUDGET = 16
"""Slots of 100 tokens; A and B 8 each on the static split (no control plane)."""
MODEL = "Qwen/Qwen2.5-3B-Instruct"
LONG_PROMPT = "abcd " * 240
"""1200 characters: 300 tokens by the emulator's count, 1200 by `chars_per_token: 1`."""
LONG_MAX_TOKENS = 100
SHORT_MAX_TOKENS = 20


def _config(engine_url: str) -> SlotshiftConfig:
    return SlotshiftConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "budget_slots": BUDGET,
                    "engine_url": engine_url,
                    "models": [MODEL],
                    # A length estimate this far off (1 character a token) would make A's
                    # requests oversize: what A gets shows that the engine's count was taken.
                    "request_cost": {
                        "tokens_per_slot": 100,
                        "max_model_len_tokens": 2048,
                        "prompt_estimate": "tokenize",
                        "chars_per_token": 1.0,
                    },
                    "tenants": [
                        {"name": "A", "api_keys": ["key-a"]},
                        {"name": "B", "api_keys": ["key-b"]},
                    ],
                }
            ],
            "gateway": {
                "pool": "p",
                "host": "127.0.0.1",
                "port": 0,
                # Nothing listens on port 1: the gateway stays on its fallback split.
                "controlplane_target": "127.0.0.1:1",
                "fallback_replicas": 1,
                "queue_max_depth": 64,
                "drain_timeout_s": 2.0,
            },
        }
    )


@dataclass
class Sample:
    slots: dict[str, int]
    requests: dict[str, int]


async def _closed_loop(
    http: aiohttp.ClientSession, url: str, key: str, prompt: str, max_tokens: int, until: float
) -> int:
    done = 0
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    while time.monotonic() < until:
        async with http.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            assert response.status == 200, await response.text()
            await response.read()
            done += 1
    return done


async def test_long_prompts_hold_their_size_and_the_slots_held_stay_within_the_budget() -> None:
    engine = EngineSim(
        EngineSimConfig(
            port=0,
            model_name=MODEL,
            max_model_len=2048,
            kv_cache_blocks=2048,
            step_base_ms=1.0,
            step_per_seq_ms=0.01,
            step_per_prefill_token_us=0.5,
        )
    )
    await engine.start()
    gateway = AdmissionGateway(_config(engine.url), gateway_id="gw-weighted")
    await gateway.start()
    try:
        tenants = gateway.state.tenants
        samples: list[Sample] = []
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                samples.append(
                    Sample(
                        {n: t.admission.in_flight for n, t in tenants.items()},
                        {n: t.admission.in_flight_requests for n, t in tenants.items()},
                    )
                )
                await asyncio.sleep(0.002)

        until = time.monotonic() + 1.5
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            sampler = asyncio.create_task(sample(), name="sample-admission")
            a = [
                _closed_loop(http, gateway.url, "key-a", LONG_PROMPT, LONG_MAX_TOKENS, until)
                for _ in range(6)
            ]
            b = [
                _closed_loop(http, gateway.url, "key-b", "hi", SHORT_MAX_TOKENS, until)
                for _ in range(10)
            ]
            done = await asyncio.gather(*a, *b)
            stop.set()
            await sampler
    finally:
        await gateway.stop()
        await engine.stop()

    a_done, b_done = sum(done[:6]), sum(done[6:])
    assert a_done > 0 and b_done > 0
    assert len(samples) > 50
    # The budget witness counts slots: within the budget at every sample, each tenant within its
    # share, while fewer requests than slots ran.
    assert all(sum(s.slots.values()) <= BUDGET for s in samples)
    assert all(s.slots["A"] <= 8 and s.slots["B"] <= 8 for s in samples)
    assert any(sum(s.requests.values()) < sum(s.slots.values()) for s in samples)
    # One long request of A costs ceil((300 + 100) / 100) = 4 slots by the engine's count: two run
    # at once (by the length estimate it would cost 13, and run alone); B runs its 8 short ones.
    assert len(text_token_ids(LONG_PROMPT)) == 300
    assert max(s.requests["A"] for s in samples) == 2
    assert max(s.slots["A"] for s in samples) == 8
    assert max(s.requests["B"] for s in samples) == 8
    assert engine.peak_in_server <= BUDGET
    assert gateway.state.prompt_estimate_fallbacks_total == 0


async def test_a_paused_weighted_request_gives_back_its_slots_and_resumes_with_them() -> None:
    """A preemptible tenant in a weighted pool: the pause level counts slots, a paused request
    frees all it held, and resumes holding them again (its prompt counted exactly, as ids)."""
    engine = EngineSim(
        EngineSimConfig(port=0, model_name="m", max_model_len=2048, step_base_ms=15.0)
    )
    await engine.start()
    config = SlotshiftConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "budget_slots": 8,
                    "engine_url": engine.url,
                    "request_cost": {"tokens_per_slot": 32, "max_model_len_tokens": 2048},
                    "tenants": [
                        {"name": "A", "api_keys": ["key-a"]},
                        {"name": "B", "api_keys": ["key-b"], "preemptible": True},
                    ],
                }
            ],
            "gateway": {
                "pool": "p",
                "port": 0,
                "controlplane_target": "127.0.0.1:1",
                "fallback_replicas": 1,
                "drain_timeout_s": 2.0,
                "paused_keepalive_interval_s": 0.05,
            },
        }
    )
    gateway = AdmissionGateway(config, gateway_id="gw-weighted")
    await gateway.start()
    version = 0

    def apply(b_limit: int, pause_above: int | None = None) -> None:
        nonlocal version
        version += 1
        limits = [
            TenantLimit("A", 8 - b_limit, 8 - b_limit),
            TenantLimit("B", b_limit, b_limit, pause_above_slots=pause_above),
        ]
        assert gateway.state.apply_allocation(version, limits)

    # 38 characters, 10 tokens by the emulator's count, plus 48: 2 slots of 32 tokens.
    body = {
        "model": "m",
        "prompt": "the batch job summarises a long report",
        "max_tokens": 48,
        "stream": True,
        "ignore_eos": True,
    }
    b = gateway.state.tenants["B"].admission
    try:
        apply(b_limit=8)
        async with aiohttp.ClientSession() as http:
            requests = [
                asyncio.create_task(_post(http, gateway.url, body, "key-b"), name=f"b{i}")
                for i in range(3)
            ]
            await wait_until(
                lambda: (b.in_flight, b.in_flight_requests) == (6, 3), message="B runs 3 x 2"
            )
            apply(b_limit=2, pause_above=2)
            await wait_until(
                lambda: (b.paused_requests, b.paused, b.in_flight) == (2, 4, 2),
                message="the two youngest paused, their 4 slots given back",
            )
            apply(b_limit=8)
            await wait_until(
                lambda: b.in_flight == 6 or all(r.done() for r in requests),
                message="both resumed, holding 2 slots each again",
            )
            statuses = await asyncio.gather(*requests)
    finally:
        await gateway.stop()
        await engine.stop()
    assert statuses == [200, 200, 200]
    assert b.pauses_total == 2
    assert (b.in_flight, b.queued) == (0, 0)


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, object], key: str) -> int:
    async with http.post(
        f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        await response.read()
        return response.status
