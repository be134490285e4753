"""Splitting each tenant's pool-wide limit among the gateways that serve the pool."""

from __future__ import annotations

from collections.abc import Mapping

from slotshift.apportion import Claim, apportion

GatewayDemand = Mapping[str, Mapping[str, tuple[int, int]]]
"""gateway id -> tenant -> (in_flight, queued) at that gateway."""


def split_among_gateways(
    tenant_limits: Mapping[str, int], demand: GatewayDemand
) -> dict[str, dict[str, int]]:
    """Give each gateway a part of each tenant's limit.

    - When the tenant's limit covers its demand (in flight plus queued) everywhere, each gateway
      gets its own demand, and what is left over (the tenant's headroom) is shared evenly, so
      that a request arriving at any gateway, even one that has none of the tenant's requests
      now, is admitted at once. (Splitting the headroom by current demand would leave an idle
      gateway nothing, and the first request of a burst to reach it would wait for a re-split.)
    - When the demand exceeds the limit, the parts follow the demand at each gateway.

    Contract: for every tenant the parts sum to its limit exactly (so the parts over all tenants
    and gateways sum to the budget); parts are whole and non-negative; the result depends only on
    the arguments (gateways are taken in sorted order). No gateways: an empty result.
    """
    gateways = sorted(demand)
    if not gateways:
        return {}
    parts: dict[str, dict[str, int]] = {g: {} for g in gateways}
    for tenant, limit in tenant_limits.items():
        wanted = [sum(demand[g].get(tenant, (0, 0))) for g in gateways]
        headroom = limit - sum(wanted)
        if headroom >= 0:
            even = apportion(headroom, [Claim(0, headroom, 1.0)] * len(gateways))
            split = [w + e for w, e in zip(wanted, even, strict=True)]
        else:
            split = apportion(limit, [Claim(0, limit, float(w)) for w in wanted])
        for gateway, part in zip(gateways, split, strict=True):
            parts[gateway][tenant] = part
    return parts


def split_is_stale(targets: Mapping[str, Mapping[str, int]], demand: GatewayDemand) -> bool:
    """True when some gateway has used up its part of a tenant's limit (its next request of that
    tenant would queue, or already does) while another gateway holds part of that limit that it
    does not use: a re-split now admits that request at once instead of after the next decision,
    so the control plane re-splits without waiting for one."""
    tenants = {t for parts in targets.values() for t in parts}
    for tenant in tenants:
        full = unused = False
        for gateway, parts in targets.items():
            in_flight, queued = demand.get(gateway, {}).get(tenant, (0, 0))
            part = parts.get(tenant, 0)
            full |= in_flight + queued >= part
            unused |= part > in_flight + queued
        if full and unused:
            return True
    return False
