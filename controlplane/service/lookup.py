"""Finding the pool a request names, with the errors every service gives for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import grpc

Value = TypeVar("Value")


async def find_pool(
    pools: Mapping[str, Value], name: str, context: grpc.aio.ServicerContext[object, object]
) -> Value:
    """The entry for pool `name`; aborts with INVALID_ARGUMENT when no pool is named and
    NOT_FOUND when it is unknown, the message starting with the field (`pool:`)."""
    if not name:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pool: required")
    value = pools.get(name)
    if value is None:
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"pool: no pool {name!r} (known: {sorted(pools)})"
        )
    assert value is not None  # abort raises; this tells the type checker
    return value
