"""AllocationService: the read-only queries people and tools (grpcurl) make.

GetDecisions answers from the pool's in-memory log (the newest decisions), or, when a since_*
field or after_decision_id asks for history, from the state store (`history`,
controlplane/state_keeper.py): what was decided before a restart too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import grpc

from controlplane.decision_log import DecisionRecord
from controlplane.pool_state import PoolState
from controlplane.service import convert
from controlplane.service.lookup import find_pool
from controlplane.store.base import HistoryQuery, StoreError
from slotshift.v1 import allocation_pb2, query_pb2, query_pb2_grpc

logger = logging.getLogger(__name__)

DEFAULT_DECISIONS = 20


class DecisionHistory(Protocol):
    """The stored decisions of a pool (controlplane/state_keeper.py, StateKeeper.history)."""

    async def __call__(
        self, pool: str, query: HistoryQuery, *, changes_only: bool
    ) -> list[DecisionRecord]:
        """Oldest first; StoreError when the store cannot be read."""


class AllocationQueryService(query_pb2_grpc.AllocationServiceServicer):
    """Answers from the pools' state; never changes it.

    history: where GetDecisions reads history from; None: history requests are refused
    (FAILED_PRECONDITION).
    """

    def __init__(
        self, pools: Mapping[str, PoolState], *, history: DecisionHistory | None = None
    ) -> None:
        self._pools = pools
        self._history = history

    async def _pool(
        self, name: str, context: grpc.aio.ServicerContext[object, object]
    ) -> PoolState:
        return await find_pool(self._pools, name, context)

    async def GetAllocation(
        self,
        request: query_pb2.GetAllocationRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> allocation_pb2.Allocation:
        state = await self._pool(request.pool, context)
        return convert.allocation_to_proto(
            state.pool,
            state.allocation,
            state.applied_versions(),
            state.gateways.part_versions(),
            state.tokens.rates(),
        )

    async def ListPools(
        self, request: query_pb2.ListPoolsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> query_pb2.ListPoolsResponse:
        pools = []
        for state in self._pools.values():
            age = state.telemetry_age_s()
            pools.append(
                query_pb2.PoolInfo(
                    name=state.pool.name,
                    budget_slots=state.pool.budget_slots,
                    policy=state.pool.policy,
                    decision_period_s=state.pool.decision_period_s,
                    gateways_connected=state.gateways_connected,
                    allocation_version=state.allocation.version,
                    telemetry_age_s=-1.0 if age is None else age,
                )
            )
        return query_pb2.ListPoolsResponse(pools=pools)

    async def ListTenants(
        self,
        request: query_pb2.ListTenantsRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> query_pb2.ListTenantsResponse:
        """The tenants of one pool, or of every pool when none is named."""
        states = (
            [await self._pool(request.pool, context)]
            if request.pool
            else list(self._pools.values())
        )
        tenants = []
        for state in states:
            loads = state.snapshot().tenants
            rates = state.tokens.rates()
            for allocation in convert.tenant_allocations(
                state.pool, state.allocation.tenant_limits
            ):
                tenants.append(
                    convert.tenant_info(
                        state.pool.name,
                        allocation,
                        loads[allocation.tenant],
                        rates.get(allocation.tenant),
                    )
                )
        return query_pb2.ListTenantsResponse(tenants=tenants)

    async def GetDecisions(
        self,
        request: query_pb2.GetDecisionsRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> query_pb2.GetDecisionsResponse:
        if request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit: must not be negative")
        if request.since_version < 0 or request.since_wall_s < 0 or request.after_decision_id < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "since_version, since_wall_s, after_decision_id: must not be negative",
            )
        state = await self._pool(request.pool, context)
        limit = request.limit or DEFAULT_DECISIONS
        if request.since_version or request.since_wall_s or request.after_decision_id:
            records = await self._stored(state.pool.name, request, limit, context)
        else:
            records = state.decisions.newest(limit, changes_only=request.changes_only)
        tenants = not request.without_tenants
        return query_pb2.GetDecisionsResponse(
            decisions=[
                convert.decision_to_proto(
                    state.pool,
                    r,
                    tenants=tenants,
                    enforced_at_wall_s=state.decisions.enforced_at(r.id),
                )
                for r in records
            ]
        )

    async def _stored(
        self,
        pool: str,
        request: query_pb2.GetDecisionsRequest,
        limit: int,
        context: grpc.aio.ServicerContext[object, object],
    ) -> list[DecisionRecord]:
        if self._history is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "no state store: no history to read"
            )
            raise AssertionError("abort raises")
        query = HistoryQuery(
            limit=limit,
            since_version=request.since_version,
            since_wall_s=request.since_wall_s,
            after_decision_id=request.after_decision_id,
        )
        try:
            return await self._history(pool, query, changes_only=request.changes_only)
        except StoreError as exc:
            logger.error("GetDecisions: cannot read the history of pool %s: %s", pool, exc)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the state store cannot be read; try again"
            )
            raise
