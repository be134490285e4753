"""Choosing how much borrowed work to pause so that lenders get their slots back at once.

A lent slot comes back by itself only when the borrower's request in it ends: seconds for a long
batch answer. For a tenant that opted in (`preemptible`), the control plane instead tells each
gateway holding that tenant's borrowed work to pause some of it (the gateway picks the youngest
by original admission and resumes them later without loss). This module decides how many, as a
level per (gateway, tenant): "pause until at most this many run here".

The grants (grants.py) stay the one guard of the budget: a paused request keeps its slot counted
in its gateway's in-flight report until it has left the engine, so pausing never lets a lender in
early; it only makes the borrower's in-flight count fall now instead of when its requests end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slotshift.apportion import Claim, apportion

CellKey = tuple[str, str]
"""(gateway id, tenant)."""


@dataclass(frozen=True, slots=True)
class CellLoad:
    """One tenant at one gateway, as the pause decision sees it."""

    in_flight: int
    """Requests running there (paused ones count until they have left the engine)."""
    queued: int
    """Requests waiting there (paused ones waiting to resume included)."""
    target: int
    """Its part of the tenant's pool-wide limit there."""
    grant: int
    """What the gateway may admit there now (at most target)."""


@dataclass(frozen=True, slots=True)
class TenantTerms:
    """The pool-wide facts about one tenant that bound what may be paused."""

    preemptible: bool
    nominal_slots: int
    """Its own share of the budget: work up to it is never paused."""
    limit_slots: int
    """Its pool-wide limit under the decision in force."""


def pause_levels(
    tenants: Mapping[str, TenantTerms], cells: Mapping[CellKey, CellLoad]
) -> dict[CellKey, int]:
    """How far each preemptible tenant's running work must shrink at each gateway.

    Returns (gateway, tenant) -> the most of that tenant's requests that may keep running there;
    cells that need no pausing are absent.

    Contract (tests/unit/controlplane/test_preemption.py checks it on random pools):
    - only preemptible tenants are named, and only where they run more than their grant;
    - a tenant never has more paused, pool-wide, than its work above max(its limit, its nominal
      share): work within its own share is never paused;
    - nothing is paused unless some tenant is owed slots: it queues at a gateway where its grant
      is below its target (the budget's headroom is used up) and it runs nothing above its own
      grants anywhere; the total paused is at most what all such tenants are owed;
    - levels never fall below the cell's grant, and a level is in_flight minus what is paused;
    - deterministic: the result depends only on the arguments.
    """
    by_tenant: dict[str, list[CellKey]] = {}
    for key in sorted(cells):
        by_tenant.setdefault(key[1], []).append(key)
    # A tenant that runs above its grant somewhere is being cut, not owed.
    cut = {
        name: any(cells[k].in_flight > cells[k].grant for k in keys)
        for name, keys in by_tenant.items()
    }
    owed = sum(
        _owed(cells[k])
        for name, keys in by_tenant.items()
        if name in tenants and not cut[name]
        for k in keys
    )
    if owed <= 0:
        return {}
    pausable: dict[str, int] = {}
    for name, terms in sorted(tenants.items()):
        keys = by_tenant.get(name, [])
        if not terms.preemptible or not cut.get(name, False):
            continue
        running = sum(cells[k].in_flight for k in keys)
        excess = sum(max(0, cells[k].in_flight - cells[k].grant) for k in keys)
        above_share = running - max(terms.limit_slots, terms.nominal_slots)
        if min(excess, above_share) > 0:
            pausable[name] = min(excess, above_share)
    if not pausable:
        return {}
    names = list(pausable)
    total = min(owed, sum(pausable.values()))
    per_tenant = apportion(total, [Claim(0, pausable[n], float(pausable[n])) for n in names])
    levels: dict[CellKey, int] = {}
    for name, count in zip(names, per_tenant, strict=True):
        if count == 0:
            continue
        keys = [k for k in by_tenant[name] if cells[k].in_flight > cells[k].grant]
        over = [cells[k].in_flight - cells[k].grant for k in keys]
        shares = apportion(count, [Claim(0, e, float(e)) for e in over])
        for key, paused in zip(keys, shares, strict=True):
            if paused > 0:
                levels[key] = cells[key].in_flight - paused
    return levels


def _owed(cell: CellLoad) -> int:
    """Slots a tenant waits for at one gateway and cannot be granted there now."""
    if cell.queued == 0:
        return 0
    wanted = min(cell.target, cell.in_flight + cell.queued)
    return max(0, wanted - max(cell.grant, cell.in_flight))
