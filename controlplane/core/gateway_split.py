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


def idle_beside(
    targets: Mapping[str, Mapping[str, int]], demand: GatewayDemand, *, waiting_only: bool
) -> set[str]:
    """The tenants of whose limit some gateway leaves part unused while another gateway has
    used its own part up (its next request would wait) or, with `waiting_only`, has a request
    waiting (more in flight and queued than its part). A re-split then admits that request at
    once instead of after the next decision."""
    tenants = {t for parts in targets.values() for t in parts}
    found: set[str] = set()
    for tenant in tenants:
        used = unused = False
        for gateway, parts in targets.items():
            in_flight, queued = demand.get(gateway, {}).get(tenant, (0, 0))
            part = parts.get(tenant, 0)
            wanted = in_flight + queued
            used |= wanted > part if waiting_only else wanted >= part
            unused |= part > wanted
        if used and unused:
            found.add(tenant)
    return found


def rebalance(
    demand: GatewayDemand, parts: Mapping[str, Mapping[str, int]], tenants: set[str]
) -> dict[str, dict[str, int]]:
    """Move the parts of `tenants` to where their requests wait, by the fewest moves: per
    tenant, while a request waits at some gateway (more in flight and queued than its part)
    and part of the limit idles at another (part above demand), the gateway that idles most
    gives one slot to the gateway that waits most (gateways in sorted order, ties to the earlier
    one).

    Contract: each tenant's parts keep their sum; parts stay whole and non-negative; afterwards
    no request of a named tenant waits while part of its limit idles; a part only moves toward
    its gateway's demand; tenants not named keep their parts.
    """
    gateways = sorted(demand)
    result = {g: dict(parts.get(g, {})) for g in gateways}

    def first_max(values: list[int]) -> int:
        return values.index(max(values))

    for tenant in tenants:
        part = [result[g].get(tenant, 0) for g in gateways]
        wanted = [sum(demand[g].get(tenant, (0, 0))) for g in gateways]
        while gateways:
            waits = [w - p for w, p in zip(wanted, part, strict=True)]
            idles = [-x for x in waits]
            if max(waits) <= 0 or max(idles) <= 0:
                break
            part[first_max(idles)] -= 1
            part[first_max(waits)] += 1
        for gateway, value in zip(gateways, part, strict=True):
            result[gateway][tenant] = value
    return result
