"""Helpers shared by the tests: waiting on conditions, free ports, the tests' key-digest secret."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slotshift.v1 import common_pb2
from slotshift.wire import demand_messages_of


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    message: str = "condition",
) -> None:
    """Poll `condition` until it holds; fail with `message` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
        await asyncio.sleep(interval_s)


def wait_until_sync(
    condition: Callable[[], bool],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    message: str = "condition",
) -> None:
    """Blocking twin of wait_until, for tests that drive real processes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
        time.sleep(interval_s)


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago (for processes that need a fixed one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


TEST_KEY_DIGEST_SECRET = "slotshift-tests-key-digest-secret-0123456789abcdef"
"""The key-digest secret of the tests' configs (tenant_keys.key_digest_secret): keyed digests,
as every shipped config has them."""

TEST_TENANT_KEYS: dict[str, str] = {"key_digest_secret": TEST_KEY_DIGEST_SECRET}
"""The tenant_keys section of a config document (or --set) with the tests' secret inline."""


def tenant_figures(message: Any) -> list[common_pb2.TenantDemand]:
    """The tenants' figures a gateway message (hello, report or ack) carries, one TenantDemand
    message each, in order: its `tenants`, then its `columns`."""
    return list(message.tenants) + demand_messages_of(message.columns)
