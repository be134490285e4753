"""Choosing how much borrowed work to pause, so that lent slots come back at once.

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
    grant: int
    """What the gateway may admit there now."""


@dataclass(frozen=True, slots=True)
class TenantTerms:
    """The pool-wide facts about one tenant that bound what may be paused."""

    preemptible: bool
    nominal_slots: int
    """Its own share of the budget: work up to it is never paused."""
    limit_slots: int
    """Its pool-wide limit under the decision in force."""
    queued_slots: int = 0
    """Its requests waiting at the gateways, pool-wide."""

    def wants_room(self, running: int) -> bool:
        """Whether another tenant's paused work would serve it now, while it runs `running`
        pool-wide: it has demand (requests of it wait for slots, or run on an engine the slo
        policy keeps fast for them)."""
        return self.queued_slots > 0 or running > 0


def pause_levels(
    tenants: Mapping[str, TenantTerms], cells: Mapping[CellKey, CellLoad]
) -> dict[CellKey, int]:
    """How far each preemptible tenant's running work must shrink at each gateway.

    A preemptible tenant's limit below what it runs means the decision wants those slots
    elsewhere (a lender asks for its share back) or free (the engine kept as fast as the static
    split for a lender using its whole share, see the slo policy): either way waiting for its
    requests to end would take seconds, and pausing takes a round trip. Only while another
    tenant has demand (TenantTerms.wants_room): a limit that fell while nobody else runs or
    waits (a decision that met a lull, every tenant between two requests: nominal shares) frees
    slots and engine time nobody would use, and pausing for it only costs the borrower its
    progress and the engine the recomputed prompts.

    Returns (gateway, tenant) -> the most of that tenant's requests that may keep running there;
    cells that need no pausing are absent.

    Contract (tests/unit/controlplane/test_preemption.py checks it on random pools):
    - only preemptible tenants are named, only where they run more than their grant, and only
      while some other tenant has demand;
    - a tenant has exactly its work above max(its limit, its nominal share) paused, pool-wide,
      or what its gateways hold above their grants if that is less: work within its own share
      is never paused;
    - levels never fall below the cell's grant, and a level is in_flight minus what is paused
      there; what is paused is spread over the tenant's gateways by what each holds above its
      grant;
    - deterministic: the result depends only on the arguments.
    """
    by_tenant: dict[str, list[CellKey]] = {}
    for key in sorted(cells):
        by_tenant.setdefault(key[1], []).append(key)
    running_of = {
        name: sum(cells[k].in_flight for k in by_tenant.get(name, [])) for name in tenants
    }
    wanting = {name for name, terms in tenants.items() if terms.wants_room(running_of[name])}
    levels: dict[CellKey, int] = {}
    for name, terms in sorted(tenants.items()):
        if not terms.preemptible or not wanting - {name}:
            continue
        keys = [k for k in by_tenant.get(name, []) if cells[k].in_flight > cells[k].grant]
        if not keys:
            continue
        over = [cells[k].in_flight - cells[k].grant for k in keys]
        running = sum(cells[k].in_flight for k in by_tenant[name])
        above_share = running - max(terms.limit_slots, terms.nominal_slots)
        count = min(sum(over), above_share)
        if count <= 0:
            continue
        shares = apportion(count, [Claim(0, e, float(e)) for e in over])
        for key, paused in zip(keys, shares, strict=True):
            if paused > 0:
                levels[key] = cells[key].in_flight - paused
    return levels
