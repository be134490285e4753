"""AllocationService: the read-only queries people and tools (grpcurl) make."""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from controlplane.pool_state import PoolState
from controlplane.service import convert
from controlplane.service.lookup import find_pool
from slotshift.v1 import allocation_pb2, query_pb2, query_pb2_grpc

DEFAULT_DECISIONS = 20


class AllocationQueryService(query_pb2_grpc.AllocationServiceServicer):
    """Answers from the pools' state; never changes it."""

    def __init__(self, pools: Mapping[str, PoolState]) -> None:
        self._pools = pools

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
        return convert.allocation_to_proto(state.pool, state.allocation, state.applied_versions())

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
            for allocation in convert.tenant_allocations(
                state.pool, state.allocation.tenant_limits
            ):
                tenants.append(
                    convert.tenant_info(state.pool.name, allocation, loads[allocation.tenant])
                )
        return query_pb2.ListTenantsResponse(tenants=tenants)

    async def GetDecisions(
        self,
        request: query_pb2.GetDecisionsRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> query_pb2.GetDecisionsResponse:
        if request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit: must not be negative")
        state = await self._pool(request.pool, context)
        records = state.decisions.newest(
            request.limit or DEFAULT_DECISIONS, changes_only=request.changes_only
        )
        return query_pb2.GetDecisionsResponse(
            decisions=[convert.decision_to_proto(state.pool, r) for r in records]
        )
