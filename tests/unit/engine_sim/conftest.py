"""The emulator on port 0 with fast steps, for the tests that talk to it over HTTP; a module
changes its settings by overriding the `sim_config` fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from engine_sim.server import EngineSim
from slotshift.config import EngineSimConfig

MODEL = "test-model"


def fast_config(**overrides: Any) -> EngineSimConfig:
    """Milliseconds-long steps, a pseudo-EOS within 20 tokens, a quick shutdown."""
    fields: dict[str, Any] = {
        "port": 0,
        "model_name": MODEL,
        "max_model_len": 2048,
        "kv_cache_blocks": 1024,
        "step_base_ms": 0.5,
        "step_per_seq_ms": 0.01,
        "step_per_prefill_token_us": 0.5,
        "pseudo_eos_max_tokens": 20,
        "shutdown_grace_s": 0.2,
    }
    fields.update(overrides)
    return EngineSimConfig(**fields)


@pytest.fixture
def sim_config() -> EngineSimConfig:
    return fast_config()


@pytest_asyncio.fixture
async def sim(sim_config: EngineSimConfig) -> AsyncIterator[EngineSim]:
    emulator = EngineSim(sim_config)
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
