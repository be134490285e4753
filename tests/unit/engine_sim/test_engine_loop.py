"""The async driver: streams tokens in order, aborts cleanly, and sleeps when idle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from engine_sim.engine_core import FinishReason, RequestSpec, ScheduledStep
from engine_sim.engine_loop import AsyncEngine
from slotshift.aiotasks import Supervisor
from slotshift.clock import SystemClock
from slotshift.config import EngineSimConfig


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    config = EngineSimConfig(step_base_ms=0.5, step_per_seq_ms=0.01, max_model_len=1024)
    driven = AsyncEngine(config, SystemClock())
    supervisor = Supervisor("test-engine")
    supervisor.spawn("steps", driven.run())
    try:
        yield driven
    finally:
        await supervisor.stop()
        assert supervisor.failures == []


async def test_tokens_arrive_in_order_then_the_finish(engine: AsyncEngine) -> None:
    stream = engine.submit(
        RequestSpec("r", prompt_token_ids=tuple(range(8)), max_output_tokens=5, ignore_eos=True)
    )

    indexes = [token.index async for token in stream.tokens()]

    assert indexes == [0, 1, 2, 3, 4]
    assert stream.finished is not None
    assert stream.finished.reason is FinishReason.LENGTH
    assert 0.0 < engine.gpu_utilization() <= 1.0


async def test_an_aborted_request_ends_its_stream(engine: AsyncEngine) -> None:
    stream = engine.submit(RequestSpec("r", tuple(range(8)), 1000, ignore_eos=True))
    first = await anext(aiter(stream.tokens()))
    assert first.index == 0

    engine.abort("r")
    engine.abort("r")  # a second abort is harmless

    remaining = [token async for token in stream.tokens()]
    assert len(remaining) < 999
    assert stream.finished is not None
    assert stream.finished.reason is FinishReason.ABORT
    assert (engine.core.num_running, engine.core.used_blocks) == (0, 0)


async def test_the_idle_loop_waits_instead_of_polling(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = engine.submit(RequestSpec("r", tuple(range(8)), 2, ignore_eos=True))
    _ = [token async for token in stream.tokens()]
    schedules: list[ScheduledStep] = []
    original = engine.core.schedule

    def counting_schedule(now_s: float) -> ScheduledStep:
        step = original(now_s)
        schedules.append(step)
        return step

    monkeypatch.setattr(engine.core, "schedule", counting_schedule)
    for _ in range(50):  # give a polling loop every chance to run
        await asyncio.sleep(0)
    assert schedules == []

    again = engine.submit(RequestSpec("again", tuple(range(8, 16)), 1, ignore_eos=True))
    _ = [token async for token in again.tokens()]
    assert len(schedules) == 1
