"""Translation between the API's messages and the control plane's own types.

A tenant's demand and its latency summaries are the ground's (slotshift.demand), converted by
slotshift.wire; this module converts what only the control plane has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from numpy.typing import NDArray

from controlplane.core.allocation import NO_PAUSE, Allocation
from controlplane.core.push import GatewayRow
from controlplane.core.snapshot import TelemetryView, TenantLoad
from controlplane.decision_log import DecisionOutcome, DecisionRecord
from controlplane.registry import TenantDirectory
from controlplane.token_ledger import TokenRate
from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig
from slotshift.v1 import admin_pb2, allocation_pb2, common_pb2, gateway_pb2, query_pb2
from slotshift.wire import latency_to_proto, to_timestamp

_OUTCOMES = {
    DecisionOutcome.PUBLISHED: query_pb2.DECISION_OUTCOME_PUBLISHED,
    DecisionOutcome.HELD: query_pb2.DECISION_OUTCOME_HELD,
    DecisionOutcome.REJECTED: query_pb2.DECISION_OUTCOME_REJECTED,
}


def tenant_allocations(
    pool: PoolConfig, limits: Mapping[str, int]
) -> list[allocation_pb2.TenantAllocation]:
    nominal = nominal_shares(pool)
    return [
        allocation_pb2.TenantAllocation(
            tenant=t.name,
            limit_slots=limits.get(t.name, 0),
            floor_slots=t.floor_slots,
            ceiling_slots=pool.ceiling_of(t),
            weight=t.weight,
            nominal_slots=nominal[t.name],
        )
        for t in pool.tenants
    ]


def allocation_to_proto(
    pool: PoolConfig,
    allocation: Allocation,
    applied_versions: Mapping[str, int],
    part_versions: Mapping[str, int] | None = None,
    token_rates: Mapping[str, TokenRate] | None = None,
) -> allocation_pb2.Allocation:
    """The snapshot as GetAllocation shows it, with the tenants' `token_rates` now (read at the
    query, not part of the version)."""
    rates = token_rates or {}
    return allocation_pb2.Allocation(
        token_rates=[
            token_rate_to_proto(tenant, rates[tenant])
            for tenant in allocation.tenant_limits
            if tenant in rates
        ],
        pool=allocation.pool,
        version=allocation.version,
        budget_slots=allocation.budget_slots,
        policy=allocation.policy,
        created_at=to_timestamp(allocation.created_at_wall_s),
        tenants=tenant_allocations(pool, allocation.tenant_limits),
        gateways=[
            allocation_pb2.GatewayAllocation(
                gateway_id=gateway_id,
                tenants=row_to_proto(GatewayRow.of(allocation.cells, row), None),
                applied_version=applied_versions.get(gateway_id, 0),
                part_version=(part_versions or {}).get(gateway_id, 0),
            )
            # The cells' rows are in gateway-id order.
            for row, gateway_id in enumerate(allocation.cells.gateway_ids)
        ],
        decision_id=allocation.decision_id,
    )


def row_to_proto(
    row: GatewayRow, columns: NDArray[np.intp] | None
) -> list[allocation_pb2.GatewayTenantLimit]:
    """The limits of `row`'s tenants at `columns` (None: every tenant)."""
    picked = range(len(row.tenants)) if columns is None else columns.tolist()
    limits: list[allocation_pb2.GatewayTenantLimit] = []
    for column in picked:
        message = allocation_pb2.GatewayTenantLimit(
            tenant=row.tenants[column],
            target_slots=int(row.targets[column]),
            limit_slots=int(row.limits[column]),
        )
        pause = int(row.pauses[column])
        if pause != NO_PAUSE:
            message.pause_above_slots = pause
        limits.append(message)
    return limits


def decision_to_proto(
    pool: PoolConfig,
    record: DecisionRecord,
    *,
    tenants: bool = True,
    enforced_at_wall_s: float | None = None,
) -> query_pb2.Decision:
    """The wire's Decision of `record`; without `tenants`, none of its per-tenant inputs and
    outputs (GetDecisionsRequest.without_tenants); `enforced_at_wall_s`: when every gateway it
    changed had acknowledged it (None: unknown)."""
    return query_pb2.Decision(
        enforced_at=None if enforced_at_wall_s is None else to_timestamp(enforced_at_wall_s),
        id=record.id,
        pool=record.pool,
        decided_at=to_timestamp(record.decided_at_wall_s),
        policy=record.policy,
        outcome=_OUTCOMES[record.outcome],
        reason=record.reason,
        version=record.version,
        budget_slots=record.budget_slots,
        inputs=[_decision_input(name, load) for name, load in record.inputs.items()]
        if tenants
        else [],
        telemetry=_telemetry_input(record.telemetry),
        outputs=tenant_allocations(pool, record.outputs) if tenants else [],
        duration_ms=record.duration_ms,
        trigger=record.trigger,
        fallback=record.fallback or "",
    )


def token_rate_to_proto(tenant: str, rate: TokenRate) -> common_pb2.TenantTokenRate:
    return common_pb2.TenantTokenRate(
        tenant=tenant,
        prompt_tokens_total=rate.prompt_tokens_total,
        completion_tokens_total=rate.completion_tokens_total,
        prompt_tokens_per_s=rate.prompt_tokens_per_s,
        completion_tokens_per_s=rate.completion_tokens_per_s,
    )


def tenant_info(
    pool: str,
    allocation: allocation_pb2.TenantAllocation,
    load: TenantLoad,
    tokens: TokenRate | None = None,
) -> query_pb2.TenantInfo:
    """One tenant as ListTenants shows it: its allocation, its load summed over the gateways and
    its tokens (none counted yet: zeros)."""
    return query_pb2.TenantInfo(
        pool=pool,
        allocation=allocation,
        tokens=token_rate_to_proto(allocation.tenant, tokens or TokenRate()),
        in_flight=load.in_flight,
        queued=load.queued,
        admitted_total=load.admitted_total,
        completed_total=load.completed_total,
        rejected_total=load.rejected_total,
    )


def _decision_input(tenant: str, load: TenantLoad) -> query_pb2.TenantDecisionInput:
    return query_pb2.TenantDecisionInput(
        tenant=tenant,
        in_flight=load.in_flight,
        queued=load.queued,
        demand_slots=load.demand_slots,
        ttft=latency_to_proto(load.ttft),
        e2e=latency_to_proto(load.e2e),
        demand_age_s=-1.0 if load.demand_age_s is None else load.demand_age_s,
    )


def _telemetry_input(view: TelemetryView | None) -> query_pb2.TelemetryInput:
    if view is None:
        return query_pb2.TelemetryInput(fresh=False, age_s=-1.0)
    return query_pb2.TelemetryInput(
        fresh=view.fresh,
        age_s=view.age_s,
        kv_cache_usage_perc=view.kv_cache_usage_perc,
        num_requests_running=view.num_requests_running,
        num_requests_waiting=view.num_requests_waiting,
        gpu_utilization_pct=view.gpu_utilization_pct,
        gpu_emulated=view.gpu_emulated,
        gpu_available=view.gpu_available,
    )


def directory_to_proto(directory: TenantDirectory) -> gateway_pb2.TenantDirectory:
    return gateway_pb2.TenantDirectory(
        pool=directory.pool,
        config_version=directory.config_version,
        reads_demand_columns=True,
        tenants=[
            gateway_pb2.TenantKeys(tenant=tenant, api_key_sha256=list(digests))
            for tenant, digests in directory.tenants.items()
        ],
    )


def pool_config_to_proto(
    pool: PoolConfig,
    config_version: int,
    key_digests: Mapping[str, tuple[bytes, ...]],
    key_id: Callable[[bytes], str],
) -> admin_pb2.PoolConfigView:
    """The pool's config as the admin API shows it: never a key nor a digest, only how many
    keys each tenant has and their ids (`key_id` of each digest, KeyDigester.key_id)."""
    return admin_pb2.PoolConfigView(
        pool=pool.name,
        config_version=config_version,
        budget_slots=pool.budget_slots,
        policy=pool.policy,
        decision_period_s=pool.decision_period_s,
        tenants=[
            admin_pb2.TenantConfigView(
                name=t.name,
                floor_slots=t.floor_slots,
                ceiling_slots=t.ceiling_slots,
                weight=t.weight,
                lendable_percent=t.lendable_percent,
                borrowing_limit_percent=t.borrowing_limit_percent,
                ttft_slo_ms=t.ttft_slo_ms,
                e2e_slo_ms=t.e2e_slo_ms,
                api_key_count=len(key_digests.get(t.name, ())),
                api_key_ids=[key_id(d) for d in key_digests.get(t.name, ())],
            )
            for t in pool.tenants
        ],
    )


def settings_from_proto(settings: admin_pb2.TenantSettings) -> dict[str, float | int]:
    """The settings a request sets (its optional fields that are present), by name."""
    return {field.name: value for field, value in settings.ListFields()}
