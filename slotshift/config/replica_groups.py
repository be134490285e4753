"""Replica groups: a model served by several engines (pools), its tenants stated once.

A pool that names a `replica_group` lists no tenants of its own: the loader gives it the group's
tenants (`SlotshiftConfig`'s validation, through `expand_replica_groups`), so that everything
downstream (the pools' states, the policies, the gateways, the admin API) sees ordinary pools.
Each pool keeps its own budget (zero-sum per server); the group says how the tenants share:

- `weight` (and every other proportion: `lendable_percent`, `borrowing_limit_percent`, the SLOs)
  is taken as it is: a proportion, so each replica's nominal shares follow it within that
  replica's own budget;
- the slot-valued fields (`floor_slots`, `ceiling_slots`) are group-wide figures, divided among
  the members in proportion to their budgets by largest remainder (`divide_slots`). A positive
  floor keeps at least 1 slot on every member (a floor is a promise of a slot wherever the
  tenant's requests may go), so a floor smaller than the members it spans sums above the group's
  figure; a ceiling part is never below the member's floor part.

`divide_group` does the division over any subset of the members, so that the control plane can
divide a group over its live replicas alone when one is lost (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError, model_validator

from slotshift.config.base import ConfigModel, Name
from slotshift.config.pools import PoolConfig, TenantConfig

SLOT_FIELDS = ("floor_slots", "ceiling_slots")
"""The tenant fields counted in slots: the group's figure is divided among its members."""


class ReplicaGroupConfig(ConfigModel):
    """A model's replicas sharing one set of tenants: the pools that name it in their
    `replica_group` take these tenants, each tenant's slot bounds divided by their budgets."""

    name: Name
    """The group's name, as its member pools' `replica_group` says it."""

    tenants: list[TenantConfig]
    """The group's tenants, as a pool's tenants are given, with group-wide slot figures:
    floor_slots and ceiling_slots count slots over all the members together and are divided
    among them in proportion to their budgets; weight and the other proportions apply on each
    member as they are."""

    @model_validator(mode="after")
    def _tenants_apart(self) -> ReplicaGroupConfig:
        if not self.tenants:
            raise ValueError(f"replica group {self.name}: needs at least one tenant")
        names = [t.name for t in self.tenants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"replica group {self.name}: tenant names repeat: {duplicates}")
        return self


def divide_slots(total: int, budgets: Sequence[int]) -> list[int]:
    """`total` slots divided among members in proportion to `budgets` (each > 0), by largest
    remainder: the parts sum to `total` exactly, each lies within one slot of its exact quota
    `total * budget / sum(budgets)`, and ties in the remainders go to the earlier member. Exact
    integer arithmetic, no rounding error. ValueError for a negative total, no budgets, or a
    budget below 1."""
    if total < 0:
        raise ValueError(f"cannot divide {total} slots")
    if not budgets or min(budgets) < 1:
        raise ValueError(f"budgets must be at least 1 each: {list(budgets)}")
    whole = sum(budgets)
    parts = [total * b // whole for b in budgets]
    remainders = [total * b % whole for b in budgets]
    left = total - sum(parts)
    # Stable sort: equal remainders keep the members' order.
    for i in sorted(range(len(budgets)), key=lambda i: -remainders[i])[:left]:
        parts[i] += 1
    return parts


def divide_group(
    tenants: Sequence[TenantConfig], budgets: Mapping[str, int]
) -> dict[str, list[TenantConfig]]:
    """Each member's tenants (member name -> its tenants, in the group's order) when the group's
    `tenants` are divided among the members of `budgets` (member name -> budget_slots, in the
    members' order): floor_slots and ceiling_slots by `divide_slots`, a positive floor at least
    1 on each member, a ceiling part at least the floor part; every other field as it is. The
    result is not checked against the members' budgets (PoolConfig's validation does that).
    ValueError when `budgets` is empty or holds a budget below 1."""
    names = list(budgets)
    sizes = [budgets[n] for n in names]
    members: dict[str, list[TenantConfig]] = {n: [] for n in names}
    for tenant in tenants:
        floors = [
            max(part, 1) if tenant.floor_slots > 0 else 0
            for part in divide_slots(tenant.floor_slots, sizes)
        ]
        ceilings: list[int | None] = [None] * len(names)
        if tenant.ceiling_slots is not None:
            ceilings = [
                max(part, floor)
                for part, floor in zip(
                    divide_slots(tenant.ceiling_slots, sizes), floors, strict=True
                )
            ]
        for name, floor, ceiling in zip(names, floors, ceilings, strict=True):
            members[name].append(
                tenant.model_copy(update={"floor_slots": floor, "ceiling_slots": ceiling})
            )
    return members


def expand_replica_groups(document: Mapping[str, Any]) -> dict[str, Any]:
    """The raw config document (a parsed YAML mapping) with each member pool's tenants filled
    in from its replica group (`divide_group` over every member); the document itself is not
    changed. ValueError naming the problem for a pool naming no group that exists, a member
    that lists tenants of its own, a group without members, or members that do not serve the
    same models. A document without replica_groups and without members comes back as it is."""
    groups_raw = document.get("replica_groups") or []
    pools_raw = document.get("pools")
    if not isinstance(pools_raw, list) or not isinstance(groups_raw, list):
        return dict(document)  # the fields' own validation names what is wrong
    groups: dict[str, ReplicaGroupConfig] = {}
    for index, raw in enumerate(groups_raw):
        group = _group(index, raw)
        if group.name in groups:
            raise ValueError(f"replica_groups: the name {group.name!r} repeats")
        groups[group.name] = group
    pools = [_as_mapping(p) for p in pools_raw]
    members: dict[str, list[tuple[int, dict[str, Any]]]] = {name: [] for name in groups}
    for index, pool in enumerate(pools):
        if pool is None or pool.get("replica_group") is None:
            continue
        group_name = pool["replica_group"]
        label = f"pools.{index} ({pool.get('name')!r})"
        if group_name not in groups:
            raise ValueError(f"{label}: replica_group {group_name!r}: no such replica group")
        if pool.get("tenants"):
            raise ValueError(
                f"{label}: a member of replica group {group_name!r} lists no tenants of its "
                "own: it takes the group's (change them in replica_groups)"
            )
        members[group_name].append((index, pool))
    expanded = list(pools_raw)
    for name, member_pools in members.items():
        if not member_pools:
            raise ValueError(f"replica group {name!r}: no pool names it as its replica_group")
        models = [_models_of(pool) for _, pool in member_pools]
        if not models[0] or any(m != models[0] for m in models):
            served = {
                str(pool.get("name")): sorted(m)
                for (_, pool), m in zip(member_pools, models, strict=True)
            }
            raise ValueError(
                f"replica group {name!r}: its members are replicas of one model and must list "
                f"the same models, at least one: {served}"
            )
        # Keyed by position: the pools' names are checked apart later.
        budgets = {str(i): _budget_of(pool) for i, pool in member_pools}
        if any(b < 1 for b in budgets.values()):
            continue  # the pool's own validation refuses the budget
        divided = divide_group(groups[name].tenants, budgets)
        for i, pool in member_pools:
            expanded[i] = {**pool, "tenants": divided[str(i)]}
    return {**document, "pools": expanded}


def _group(index: int, raw: object) -> ReplicaGroupConfig:
    """The group entry validated; ValueError naming its bad fields under `replica_groups.N`
    (validated here, before the document's own fields, its errors would lack the path)."""
    if isinstance(raw, ReplicaGroupConfig):
        return raw
    try:
        return ReplicaGroupConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<group>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ValueError(f"replica_groups.{index}: {problems}") from None


def _as_mapping(pool: object) -> dict[str, Any] | None:
    """A pool entry as a mapping of its fields (a PoolConfig built in code as its fields, with
    its tenants dropped: a member's tenants are always its group's division); None for an entry
    that is neither, which the pool's own validation refuses."""
    if isinstance(pool, PoolConfig):
        fields = {name: getattr(pool, name) for name in type(pool).model_fields}
        if pool.replica_group is not None:
            fields.pop("tenants")
        return fields
    if isinstance(pool, Mapping):
        return dict(pool)
    return None


def _models_of(pool: Mapping[str, Any]) -> frozenset[str]:
    models = pool.get("models") or []
    return frozenset(str(m) for m in models) if isinstance(models, list) else frozenset()


def _budget_of(pool: Mapping[str, Any]) -> int:
    """The pool's budget_slots as the pool's validation will read it; 0 for none it takes."""
    budget = pool.get("budget_slots")
    if isinstance(budget, bool):
        return 0
    if isinstance(budget, int):
        return budget
    if isinstance(budget, str) and budget.strip().isdigit():
        return int(budget)
    return 0
