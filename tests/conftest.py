"""Suite-wide fixtures: every async test fails if it leaves an asyncio task running; a
PostgreSQL server for the tests that need one."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tests.postgres import PG_ROOT, PostgresServer, postgres_bin_dir

# Tasks a test may leave for its event loop's own teardown: grpc.aio's internal pollers.
_TOLERATED_TASK_PREFIXES = ("grpc:",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and inspect.iscoroutinefunction(function):
            item.fixturenames.insert(0, "fail_on_leaked_tasks")  # type: ignore[attr-defined]


@pytest_asyncio.fixture
async def fail_on_leaked_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    # Let tasks that were cancelled during teardown run their last step; this yields to the loop
    # a bounded number of times and waits for nothing in particular.
    for _ in range(20):
        await asyncio.sleep(0)
    current = asyncio.current_task()
    leaked = [
        task
        for task in asyncio.all_tasks()
        if task not in before
        and task is not current
        and not task.done()
        and not _describe(task).startswith(_TOLERATED_TASK_PREFIXES)
    ]
    for task in leaked:
        task.cancel()
    if leaked:
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(
            f"test left {len(leaked)} asyncio task(s) running: {[_describe(t) for t in leaked]}"
        )


def _describe(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    qualname = getattr(coro, "__qualname__", repr(coro))
    filename = getattr(getattr(coro, "cr_code", None), "co_filename", "")
    origin = "grpc" if f"{filename}".replace("\\", "/").count("/grpc/") else "test"
    return f"{origin}: {task.get_name()} {qualname} {filename}"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the session (tests/postgres.py); skipped where Debian's
    `postgresql` package is not installed (.ci/run installs it)."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(f"PostgreSQL is not installed (no initdb under {PG_ROOT}/*/bin)")
    server = PostgresServer(bin_dir)
    try:
        server.start()
    except subprocess.CalledProcessError as exc:
        server.stop()
        raise RuntimeError(f"PostgreSQL did not start: {exc.stderr!r}") from exc
    try:
        yield server
    finally:
        server.stop()
