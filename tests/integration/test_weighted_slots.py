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
from engine_sim.server import EngineSim
from engine_sim.tokens import text_token_ids
from slotshift.config import EngineSimConfig, SlotshiftConfig

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
