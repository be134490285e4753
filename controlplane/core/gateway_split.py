"""Splitting each tenant's pool-wide limit among the gateways that serve the pool."""

from __future__ import annotations

from collections.abc import Mapping

from slotshift.apportion import Claim, apportion

GatewayDemand = Mapping[str, Mapping[str, tuple[int, int]]]
"""gateway id -> tenant -> (in_flight, queued) at that gateway."""


def split_among_gateways(
    tenant_limits: Mapping[str, int], demand: GatewayDemand
) -> dict[str, dict[str, int]]:
    """Give each gateway a part of each tenant's limit, in proportion to the tenant's demand
    (in flight plus queued) at that gateway; a tenant with no demand anywhere is split evenly.

    Contract: for every tenant the parts sum to its limit exactly (so the parts over all tenants
    and gateways sum to the budget); parts are whole and non-negative; the result depends only on
    the arguments (gateways are taken in sorted order). No gateways: an empty result.
    """
    gateways = sorted(demand)
    if not gateways:
        return {}
    parts: dict[str, dict[str, int]] = {g: {} for g in gateways}
    for tenant, limit in tenant_limits.items():
        claims = [Claim(0, limit, float(sum(demand[g].get(tenant, (0, 0))))) for g in gateways]
        for gateway, part in zip(gateways, apportion(limit, claims), strict=True):
            parts[gateway][tenant] = part
    return parts


def split_is_stale(targets: Mapping[str, Mapping[str, int]], demand: GatewayDemand) -> bool:
    """True when some gateway queues a tenant's requests at or above its part while another
    gateway holds part of that tenant's limit that it does not use: a re-split would admit work
    that now waits, so the control plane re-splits without waiting for the next decision."""
    tenants = {t for parts in targets.values() for t in parts}
    for tenant in tenants:
        starved = unused = False
        for gateway, parts in targets.items():
            in_flight, queued = demand.get(gateway, {}).get(tenant, (0, 0))
            part = parts.get(tenant, 0)
            starved |= queued > 0 and in_flight >= part
            unused |= part > in_flight + queued
        if starved and unused:
            return True
    return False
