"""in_own_task: awaiting a coroutine in a task of its own is awaiting it, results, errors and
cancellation included."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from slotshift.aiotasks import in_own_task


async def test_the_result_and_the_error_are_the_callers() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("no")

    assert await in_own_task(answer(), name="answer") == 42
    with pytest.raises(ValueError, match="no"):
        await in_own_task(fail(), name="fail")


async def test_the_task_runs_in_the_callers_context_under_its_name() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller's")

    async def look() -> tuple[str, str]:
        task = asyncio.current_task()
        assert task is not None
        return var.get(), task.get_name()

    assert await in_own_task(look(), name="looker") == ("caller's", "looker")


async def test_cancelling_the_caller_cancels_the_task_and_waits_for_its_cleanup() -> None:
    started = asyncio.Event()
    cleaned: list[str] = []

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            cleaned.append("cleaned")

    async def caller() -> None:
        try:
            await in_own_task(work(), name="work")
        finally:
            # The task's cleanup ran before the caller goes on.
            cleaned.append("caller saw " + ",".join(cleaned))

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["cleaned", "caller saw cleaned"]
