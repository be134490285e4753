"""A replica group's lost members: when one is taken for lost, and what its survivors run then.
Pure: no I/O, no clock of its own (controlplane/replica_watch.py reads the telemetry and the
clock, and applies the result).

The signal (docs/operations.md, "Replica groups"): a member's engine is *down* when its agent's
latest report says the engine's `/metrics` could not be scraped, or when the member has had
telemetry and it went silent (the agent, or its node, gone). A member never heard from since
the control plane started is not down: without an agent there is no evidence either way, and a
replica is never taken for lost without evidence. `ReplicaLossTracker` adds the hysteresis: lost
once down held `lost_after_s`, back once up held `back_after_s`.

The division (`live_bounds`): while some members of a group are lost and some live, each live
member takes the group's floors and ceilings divided over the live members' budgets alone
(`divide_group`), never below what it holds under the whole group's division, and its floors
capped to its own budget (each server's budget stays its own, zero-sum per server). A lost
member, and every member of a group with none lost or none live, holds the whole group's
division: what the file says.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slotshift.config import PoolConfig, SlotshiftConfig, TenantConfig, divide_group, divide_slots


@dataclass(frozen=True, slots=True)
class TenantBounds:
    """One tenant's slot bounds on one member pool."""

    floor_slots: int
    ceiling_slots: int | None
    """None: the whole budget, as TenantConfig.ceiling_slots."""


Bounds = Mapping[str, Mapping[str, TenantBounds]]
"""member pool -> tenant -> its bounds there."""


def engine_down(
    *, reported: bool, scraped: bool, age_s: float | None, silent_after_s: float
) -> bool:
    """Whether a member's telemetry says its engine is down now: it has reported (`reported`,
    with its latest report `age_s` seconds old) and that report says the scrape failed
    (`scraped` false) or is older than `silent_after_s`. Never down without a report."""
    if not reported or age_s is None:
        return False
    return not scraped or age_s > silent_after_s


@dataclass(slots=True)
class _Health:
    lost: bool
    since_s: float | None
    """Since when the signal has said the opposite of `lost` (None: it agrees)."""


class ReplicaLossTracker:
    """Which members are lost, from the signal observed over time (hysteresis): a member is lost
    once its signal has said down at every observation for `lost_after_s`, and back once it has
    said up at every observation for `back_after_s`; a single observation the other way starts
    the wait again. Members start live. Time is given by the caller (monotonic seconds)."""

    def __init__(self, *, lost_after_s: float, back_after_s: float) -> None:
        if lost_after_s < 0 or back_after_s < 0:
            raise ValueError(f"waits must be at least 0: {lost_after_s}, {back_after_s}")
        self._lost_after_s = lost_after_s
        self._back_after_s = back_after_s
        self._health: dict[str, _Health] = {}

    @property
    def lost(self) -> frozenset[str]:
        """The members taken for lost now."""
        return frozenset(name for name, health in self._health.items() if health.lost)

    def observe(self, member: str, down: bool, now_s: float) -> bool:
        """Take `member`'s signal (`down`) as observed at `now_s` (not before the last
        observation); returns whether it is lost after it."""
        health = self._health.setdefault(member, _Health(lost=False, since_s=None))
        if down == health.lost:
            health.since_s = None
            return health.lost
        if health.since_s is None:
            health.since_s = now_s
        wait_s = self._lost_after_s if down else self._back_after_s
        if now_s - health.since_s >= wait_s:
            health.lost = down
            health.since_s = None
        return health.lost

    def held_s(self, member: str, now_s: float) -> float:
        """Seconds the member's signal has disagreed with its state (0 when it agrees)."""
        health = self._health.get(member)
        if health is None or health.since_s is None:
            return 0.0
        return now_s - health.since_s


def live_division(
    tenants: Sequence[TenantConfig], budgets: Mapping[str, int], live: Collection[str]
) -> dict[str, dict[str, TenantBounds]]:
    """Each member's tenants' bounds (member -> tenant -> bounds) when the group of `tenants`
    spans the members of `budgets` (member -> budget_slots, in the members' order) and only
    those in `live` serve. With every member live, or none: the whole group's division
    (`divide_group` over every member). Otherwise a lost member keeps that division and each
    live member takes, per tenant, the larger of its part over the live members alone and its
    part over all; where those floors sum above its budget, each tenant keeps its part over all
    plus a share of the room left in the budget in proportion to what it would gain (largest
    remainder, ties to the tenant listed first), so that the floors fill the budget exactly. A
    ceiling is never below the floor. When the whole group's division fits every member (as a
    valid config's does), the result does too: floors within the budget, ceilings covering it.
    ValueError when `budgets` is empty or holds a budget below 1."""
    whole = _bounds_of(divide_group(tenants, budgets))
    serving = [name for name in budgets if name in live]
    if not serving or len(serving) == len(budgets):
        return whole
    over_live = _bounds_of(divide_group(tenants, {name: budgets[name] for name in serving}))
    division = dict(whole)
    for name in serving:
        division[name] = _grown(whole[name], over_live[name], budgets[name])
    return division


def live_bounds(
    config: SlotshiftConfig, lost: Collection[str]
) -> dict[str, dict[str, TenantBounds]]:
    """The bounds every member pool of every replica group of `config` runs with while the
    pools of `lost` are lost (`live_division` per group, over the members' budgets as the
    config gives them); pools of no group are not in it."""
    division: dict[str, dict[str, TenantBounds]] = {}
    for group in config.replica_groups:
        members = config.members_of(group.name)
        if not members:
            continue
        budgets = {pool.name: pool.budget_slots for pool in members}
        live = [name for name in budgets if name not in lost]
        division.update(live_division(group.tenants, budgets, live))
    return division


def holds(pool: PoolConfig, bounds: Mapping[str, TenantBounds]) -> bool:
    """Whether every tenant of `pool` named in `bounds` holds those bounds already."""
    return all(
        bounds[t.name] == TenantBounds(t.floor_slots, t.ceiling_slots)
        for t in pool.tenants
        if t.name in bounds
    )


def with_bounds(pool: PoolConfig, bounds: Mapping[str, TenantBounds]) -> PoolConfig:
    """`pool` with each tenant named in `bounds` holding those floor and ceiling slots, validated
    again (pydantic's ValidationError, a ValueError, when the result is not a valid pool);
    `pool` itself when it holds them already. Every other field, the tenants' keys included,
    as it is."""
    if holds(pool, bounds):
        return pool
    tenants: list[Any] = []
    for tenant in pool.tenants:
        bound = bounds.get(tenant.name)
        tenants.append(
            tenant
            if bound is None
            else tenant.model_copy(
                update={"floor_slots": bound.floor_slots, "ceiling_slots": bound.ceiling_slots}
            )
        )
    fields = {name: getattr(pool, name) for name in type(pool).model_fields}
    fields["tenants"] = tenants
    return PoolConfig.model_validate(fields)


def describe(before: PoolConfig, after: PoolConfig) -> list[str]:
    """The tenants whose bounds moved from `before` to `after`, in words: `A floor 4 -> 8,
    ceiling 20 -> 40`."""
    old = {t.name: t for t in before.tenants}
    words: list[str] = []
    for tenant in after.tenants:
        was = old.get(tenant.name)
        if was is None:
            continue
        parts = []
        if was.floor_slots != tenant.floor_slots:
            parts.append(f"floor {was.floor_slots} -> {tenant.floor_slots}")
        if was.ceiling_slots != tenant.ceiling_slots:
            parts.append(f"ceiling {_slots(was.ceiling_slots)} -> {_slots(tenant.ceiling_slots)}")
        if parts:
            words.append(f"{tenant.name} {', '.join(parts)}")
    return words


def _slots(ceiling: int | None) -> str:
    return "budget" if ceiling is None else str(ceiling)


def _bounds_of(members: Mapping[str, list[TenantConfig]]) -> dict[str, dict[str, TenantBounds]]:
    return {
        name: {t.name: TenantBounds(t.floor_slots, t.ceiling_slots) for t in tenants}
        for name, tenants in members.items()
    }


def _grown(
    whole: Mapping[str, TenantBounds], over_live: Mapping[str, TenantBounds], budget: int
) -> dict[str, TenantBounds]:
    """A live member's bounds: the larger of its two parts, the floors fitted into `budget`
    (live_division)."""
    names = list(whole)
    base = [whole[n].floor_slots for n in names]
    wanted = [max(whole[n].floor_slots, over_live[n].floor_slots) for n in names]
    floors = wanted
    if sum(wanted) > budget:
        floors = list(base)
        room = budget - sum(base)
        extra = [w - b for w, b in zip(wanted, base, strict=True)]
        gaining = [i for i, e in enumerate(extra) if e > 0]
        # 0 < room < sum(extra) here (a whole-group division that fills the budget leaves no
        # room), so every share stays within what its tenant would gain.
        if room > 0 and gaining:
            shares = divide_slots(room, [extra[i] for i in gaining])
            for i, share in zip(gaining, shares, strict=True):
                floors[i] += share
    grown: dict[str, TenantBounds] = {}
    for name, floor in zip(names, floors, strict=True):
        ceiling = whole[name].ceiling_slots
        live_ceiling = over_live[name].ceiling_slots
        # divide_group leaves a ceiling unset on every member or on none.
        if ceiling is not None and live_ceiling is not None:
            ceiling = max(ceiling, live_ceiling, floor)
        grown[name] = TenantBounds(floor, ceiling)
    return grown
