"""Supervised background tasks: named, logged when they fail, cancelled and awaited in order.

Modelled on kopf's aiotasks: every background task is created through a TaskGroup-like
Supervisor, so none is anonymous or forgotten; a task that ends while it should run forever is
reported; CancelledError always propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Supervisor:
    """Owns a set of named background tasks and stops them together."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.failures: list[tuple[str, BaseException]] = []
        """(task name, exception) for each task that died of an error."""

    def spawn(
        self, name: str, coro: Coroutine[Any, Any, Any], *, forever: bool = True
    ) -> asyncio.Task[Any]:
        """Start `coro` as a task named `{supervisor}/{name}`.

        forever: the task should run until stopped; ending earlier is logged as an error.
        """
        if self._stopping:
            coro.close()
            raise RuntimeError(f"{self._name} is stopping; cannot start {name}")
        task = asyncio.create_task(coro, name=f"{self._name}/{name}")
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._on_done(t, forever))
        return task

    def _on_done(self, task: asyncio.Task[Any], forever: bool) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.failures.append((task.get_name(), exc))
            logger.error("task %s failed", task.get_name(), exc_info=exc)
        elif forever and not self._stopping:
            logger.error("task %s ended although it should run until stopped", task.get_name())

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        return frozenset(self._tasks)

    def begin_stop(self) -> None:
        """From now on tasks may end: an owner that winds tasks down gently before stop() calls
        this first, so that their ending is not reported as a failure."""
        self._stopping = True

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel every task and wait for them, at most timeout_s; survives being cancelled again."""
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            logger.error("task %s did not stop within %.1f s", task.get_name(), timeout_s)


async def in_own_task(coro: Coroutine[Any, Any, T], *, name: str) -> T:
    """`await coro`, run as a task of its own named `name`.

    For a loop that wakes often deep under a request handler (a relayed stream wakes once an
    event): each wake-up of a coroutine resumes every coroutine frame that awaits it, down from
    the handler's task, and a relay sits a dozen frames deep; in a task of its own it resumes
    its own few. The caller's context is the task's; cancelling the caller cancels the task
    (asyncio cancels the future a task waits on), and the caller goes on once the task has
    ended: its cleanup has run, and its result or error is the caller's."""
    return await asyncio.get_running_loop().create_task(coro, name=name)
