"""The gateway stream's writer: the first update whole, then only what changed; a change that may
wait is held for the gateway's next push slot, and goes out with whatever came after it; a
change that may not wait goes out at once. And the runtime's pacing of re-grants."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import numpy as np
import pytest

from controlplane.core.allocation import NO_PAUSE, CellLimits
from controlplane.pool_state import PoolState
from controlplane.registry import Delivery, GatewaySession
from controlplane.runtime import PoolRuntime
from controlplane.service.gateway_service import GatewayStreamService
from slotshift.clock import ManualClock
from slotshift.demand import TenantDemand
from slotshift.v1 import gateway_pb2
from tests.support import wait_until
from tests.unit.controlplane.test_pool_state import POOL, _state

SLOT_S = 60.0
"""A push slot far longer than any test: a held change can only go out with an urgent one."""


class _Stream:
    """What the writer writes to: the control messages, in order."""

    def __init__(self) -> None:
        self.updates: list[gateway_pb2.AllocationUpdate] = []

    async def write(self, message: gateway_pb2.ControlMessage) -> None:
        if message.HasField("allocation"):
            self.updates.append(message.allocation)


def _deliver(
    state: PoolState,
    session: GatewaySession,
    version: int,
    targets: list[int],
    limits: list[int],
    pool: tuple[int, int] = (100, 100),
) -> None:
    """Put an allocation for the session's gateway (tenants A, B) in its mailbox; `pool`: the
    tenants' pool-wide limits (other gateways hold the rest; a change of them is a decision's)."""
    shape = (1, len(state.tenants))
    cells = CellLimits.of(
        (session.gateway_id,),
        state.tenants,
        np.array([targets], dtype=np.int64).reshape(shape),
        np.array([limits], dtype=np.int64).reshape(shape),
        np.full(shape, NO_PAUSE, dtype=np.int64),
        pool_limits=np.array(pool, dtype=np.int64),
    )
    allocation = dataclasses.replace(state.allocation, version=version, cells=cells)
    session.mailbox.put(Delivery(allocation))


@dataclasses.dataclass
class _Writing:
    clock: ManualClock
    state: PoolState
    session: GatewaySession
    stream: _Stream


@contextlib.asynccontextmanager
async def _writing() -> AsyncIterator[_Writing]:
    """The writer of gateway "gw"'s stream (tenants A, B) running on a manual clock with a push
    slot of SLOT_S, its connection's own allocation taken: the test sends its own."""
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [TenantDemand("A"), TenantDemand("B")])
    session.mailbox.take_nowait()
    service = GatewayStreamService({POOL.name: state}, clock=clock, push_min_interval_s=SLOT_S)
    stream = _Stream()
    context = cast("grpc.aio.ServicerContext[object, object]", cast(Any, stream))
    writer = asyncio.create_task(service._write(state, session, context), name="writer")
    try:
        yield _Writing(clock, state, session, stream)
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer


async def test_held_changes_ride_with_the_next_urgent_one_and_the_slot_frees_them() -> None:
    async with _writing() as w:
        clock, state, session, stream = w.clock, w.state, w.session, w.stream
        _deliver(state, session, 1, [48, 48], [48, 48])
        await wait_until(lambda: len(stream.updates) == 1, message="the first update")
        first = stream.updates[0]
        assert not first.delta and {t.tenant for t in first.tenants} == {"A", "B"}

        # A's headroom grows, no request of A waits: it may wait for the slot (60 s away).
        _deliver(state, session, 2, [50, 46], [48, 46])
        # ... a decision shrinks B: that may not wait, and carries A's held change with it.
        _deliver(state, session, 3, [50, 44], [50, 44], pool=(102, 98))
        await wait_until(lambda: len(stream.updates) == 2, message="the urgent update")
        second = stream.updates[1]
        assert second.version == 3 and second.delta
        assert {t.tenant: (t.target_slots, t.limit_slots) for t in second.tenants} == {
            "A": (50, 50),
            "B": (44, 44),
        }

        # Another change that may wait, then the slot passes: it goes out alone.
        _deliver(state, session, 4, [52, 44], [52, 44], pool=(102, 98))
        for _ in range(50):
            await asyncio.sleep(0)
        assert len(stream.updates) == 2, "held for the slot"
        # The first update took the first slot and the urgent one the second.
        clock.advance(2 * SLOT_S)
        session.mailbox.wake()
        await wait_until(lambda: len(stream.updates) == 3, message="the held update")
        third = stream.updates[2]
        assert third.version == 4
        assert [(t.tenant, t.limit_slots) for t in third.tenants] == [("A", 52)]


async def test_urgent_updates_take_the_next_slots_so_the_rate_stays_one_per_interval() -> None:
    async with _writing() as w:
        clock, state, session, stream = w.clock, w.state, w.session, w.stream
        _deliver(state, session, 1, [48, 48], [48, 48])
        await wait_until(lambda: len(stream.updates) == 1, message="the first update")
        # Two shrinks of B (its pool-wide limit falls): urgent, out at once, each taking a slot.
        _deliver(state, session, 2, [50, 46], [48, 46], pool=(102, 98))
        await wait_until(lambda: len(stream.updates) == 2, message="the first urgent update")
        _deliver(state, session, 3, [52, 44], [48, 44], pool=(104, 96))
        await wait_until(lambda: len(stream.updates) == 3, message="the second urgent update")
        # A's grant catching up may wait: the urgent updates took the next slots, as far as
        # two intervals ahead (not three: the debt is capped).
        _deliver(state, session, 4, [52, 44], [52, 44], pool=(104, 96))
        clock.advance(SLOT_S)
        session.mailbox.wake()
        for _ in range(50):
            await asyncio.sleep(0)
        assert len(stream.updates) == 3, "the slots the urgent updates took are not free"
        clock.advance(SLOT_S)
        session.mailbox.wake()
        await wait_until(lambda: len(stream.updates) == 4, message="the held update")
        assert stream.updates[3].version == 4


async def test_a_burst_of_reports_is_one_regrant_under_the_runtime() -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [])
    runtime = PoolRuntime(state, clock=clock, reconcile_min_interval_s=SLOT_S)
    passes = 0
    reconcile = state.reconcile

    def counted(**kwargs: Any) -> Any:
        nonlocal passes
        passes += 1
        return reconcile(**kwargs)

    state.reconcile = counted  # type: ignore[method-assign]
    regrants = asyncio.create_task(runtime.regrants(), name="regrants")
    try:
        await wait_until(lambda: state.reconcile_soon is not None, message="the runtime paces")
        for queued in range(1, 21):
            state.record_demand(session, 0, [TenantDemand("B", queued=queued)])
        await wait_until(lambda: passes == 1, message="one re-grant for the burst")
        for _ in range(50):
            await asyncio.sleep(0)
        assert passes == 1, "the rest waits for the interval"
        assert state.snapshot().tenants["B"].queued == 20, "every report was taken"
    finally:
        regrants.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await regrants
    assert state.reconcile_soon is None, "without the runtime, messages reconcile at once"


@pytest.mark.parametrize("max_cores", [1.0, 0.1])
async def test_a_costly_regrant_rests_to_keep_within_its_share_of_a_core(max_cores: float) -> None:
    """A re-grant that takes 100 s of the injected clock: with a whole core allowed the next
    one runs at once; with a tenth it rests 900 s (the test would time out)."""
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [])
    runtime = PoolRuntime(
        state, clock=clock, reconcile_min_interval_s=SLOT_S, reconcile_max_cores=max_cores
    )
    passes = 0
    reconcile = state.reconcile

    def slow(**kwargs: Any) -> Any:
        nonlocal passes
        passes += 1
        clock.advance(100.0)
        return reconcile(**kwargs)

    state.reconcile = slow  # type: ignore[method-assign]
    regrants = asyncio.create_task(runtime.regrants(), name="regrants")
    try:
        await wait_until(lambda: state.reconcile_soon is not None, message="the runtime paces")
        state.record_demand(session, 0, [TenantDemand("B", queued=1)])
        await wait_until(lambda: passes == 1, message="the first re-grant")
        state.record_demand(session, 0, [TenantDemand("B", queued=2)])
        if max_cores == 1.0:
            await wait_until(lambda: passes == 2, message="the next re-grant at once")
        else:
            for _ in range(50):
                await asyncio.sleep(0)
            assert passes == 1, "the next re-grant rests"
    finally:
        regrants.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await regrants
