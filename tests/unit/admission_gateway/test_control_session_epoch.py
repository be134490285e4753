"""A gateway's control session refuses allocations from a leader older than one it has heard
(AllocationUpdate.epoch): a deposed control-plane replica cannot hand out budget."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from admission_gateway.control_session import ControlSession
from admission_gateway.gateway_state import GatewayState, TenantLimit
from slotshift.clock import ManualClock
from slotshift.config import GatewayConfig, PoolConfig, TenantConfig
from slotshift.v1 import allocation_pb2, gateway_pb2

POOL = PoolConfig(
    name="p",
    budget_slots=40,
    tenants=[TenantConfig(name="A", floor_slots=2), TenantConfig(name="B", floor_slots=2)],
)


class MemoryStream:
    """A control stream in memory: what the gateway writes is kept, the control plane's
    messages are played in order, then the stream stays open until `end()`."""

    def __init__(self, messages: list[gateway_pb2.ControlMessage]) -> None:
        self.written: list[gateway_pb2.GatewayMessage] = []
        self._incoming: asyncio.Queue[gateway_pb2.ControlMessage | None] = asyncio.Queue()
        for message in messages:
            self._incoming.put_nowait(message)

    def end(self) -> None:
        self._incoming.put_nowait(None)

    async def write(self, message: gateway_pb2.GatewayMessage) -> None:
        self.written.append(message)

    async def _messages(self) -> AsyncIterator[gateway_pb2.ControlMessage]:
        while (message := await self._incoming.get()) is not None:
            yield message

    def __aiter__(self) -> AsyncIterator[gateway_pb2.ControlMessage]:
        return self._messages()

    def acks(self) -> list[int]:
        return [m.ack.version for m in self.written if m.HasField("ack")]


def _update(epoch: int, version: int, a_slots: int) -> gateway_pb2.ControlMessage:
    return gateway_pb2.ControlMessage(
        allocation=gateway_pb2.AllocationUpdate(
            pool="p",
            gateway_id="gw",
            version=version,
            epoch=epoch,
            budget_slots=40,
            tenants=[
                allocation_pb2.GatewayTenantLimit(
                    tenant="A", target_slots=a_slots, limit_slots=a_slots
                ),
                allocation_pb2.GatewayTenantLimit(tenant="B", target_slots=4, limit_slots=4),
            ],
        )
    )


def _session(state: GatewayState, clock: ManualClock) -> ControlSession:
    return ControlSession(
        state,
        gateway_id="gw",
        report_interval_s=60.0,
        queue_report_min_interval_s=30.0,
        full_report_interval_s=60.0,
        clock=clock,
    )


def _limit_of_a(state: GatewayState) -> int:
    return state.tenants["A"].admission.limit_slots


async def test_an_update_from_an_older_epoch_is_refused_and_ends_the_stream() -> None:
    clock = ManualClock()
    state = GatewayState(POOL, GatewayConfig(), clock)
    session = _session(state, clock)
    # The new leader (epoch 3) numbers its versions afresh; its update wins over the old
    # leader's higher version; the old leader's next update (epoch 2) is refused.
    new_leader = MemoryStream([_update(3, 10, a_slots=7)])
    new_leader.end()
    assert state.apply_allocation(500, [TenantLimit("A", target_slots=5, limit_slots=5)], epoch=2)
    assert await session.run(new_leader, lambda: None) == "the control plane ended the stream"
    assert (state.epoch, state.applied_version, _limit_of_a(state)) == (3, 10, 7)
    assert new_leader.acks() == [10]

    old_leader = MemoryStream([_update(2, 900, a_slots=30)])
    ending = await session.run(old_leader, lambda: None)
    assert "deposed leader" in ending
    assert (state.epoch, state.applied_version, _limit_of_a(state)) == (3, 10, 7)
    assert old_leader.acks() == [], "a refused update is not acknowledged"


async def test_within_an_epoch_only_newer_versions_apply() -> None:
    clock = ManualClock()
    state = GatewayState(POOL, GatewayConfig(), clock)
    stream = MemoryStream([_update(4, 20, a_slots=6), _update(4, 19, a_slots=9)])
    stream.end()
    await _session(state, clock).run(stream, lambda: None)
    assert (state.epoch, state.applied_version, _limit_of_a(state)) == (4, 20, 6)
    assert stream.acks() == [20]


def test_the_state_orders_allocations_by_epoch_then_version() -> None:
    state = GatewayState(POOL, GatewayConfig(), ManualClock())
    limits = [TenantLimit("A", target_slots=3, limit_slots=3)]
    assert state.apply_allocation(5, limits, epoch=1)
    assert not state.apply_allocation(6, limits, epoch=0)
    assert not state.apply_allocation(5, limits, epoch=1)
    assert state.apply_allocation(1, limits, epoch=2)
    assert (state.epoch, state.applied_version) == (2, 1)
