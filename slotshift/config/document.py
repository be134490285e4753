"""The whole configuration file: its pools and each service's section."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from slotshift.config.base import ConfigModel
from slotshift.config.emulator import EngineSimConfig
from slotshift.config.local_stack import LocalStackConfig
from slotshift.config.pools import PoolConfig
from slotshift.config.replica_groups import ReplicaGroupConfig, expand_replica_groups
from slotshift.config.secrets import reveal
from slotshift.config.services import AgentConfig, ControlPlaneConfig, GatewayConfig
from slotshift.config.tenant_keys import TenantKeysConfig


class SlotshiftConfig(ConfigModel):
    """The whole configuration file."""

    pools: list[PoolConfig]
    """The pools the control plane manages. A pool naming a `replica_group` has its tenants
    filled in from the group when the document is validated."""

    replica_groups: list[ReplicaGroupConfig] = Field(default_factory=list)
    """Models served by several pools (replicas), their tenants stated once: each member pool
    names its group in `replica_group` and gets the group's tenants, their slot figures divided
    by the members' budgets. Empty: every pool lists its own tenants."""

    tenant_keys: TenantKeysConfig = TenantKeysConfig()
    """How the tenants' API keys are digested (the control plane's and the gateways')."""

    controlplane: ControlPlaneConfig = ControlPlaneConfig()
    gateway: GatewayConfig = GatewayConfig()
    agent: AgentConfig = AgentConfig()
    engine_sim: EngineSimConfig = EngineSimConfig()
    local_stack: LocalStackConfig = LocalStackConfig()

    def pool(self, name: str) -> PoolConfig:
        """The pool called `name`; KeyError if there is none."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    @model_validator(mode="before")
    @classmethod
    def _expand_replica_groups(cls, data: Any) -> Any:
        # Before the pools are validated: a member pool is only valid with its tenants.
        if isinstance(data, dict):
            return expand_replica_groups(data)
        return data

    @model_serializer(mode="wrap")
    def _members_without_tenants(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A dump is the file's form again: a member's tenants are its group's, filled in anew
        # when the dump is validated (an override of a budget divides the group again).
        data = handler(self)
        if isinstance(data, dict) and isinstance(data.get("pools"), list):
            for pool in data["pools"]:
                if isinstance(pool, dict) and pool.get("replica_group") is not None:
                    pool.pop("tenants", None)
        return data

    def replica_group(self, name: str) -> ReplicaGroupConfig:
        """The replica group called `name`; KeyError if there is none."""
        for group in self.replica_groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def members_of(self, group: str) -> list[PoolConfig]:
        """The pools whose replica_group is `group`, in the pools' order (empty for none)."""
        return [p for p in self.pools if p.replica_group == group]

    @model_validator(mode="after")
    def _pools_unique(self) -> SlotshiftConfig:
        if not self.pools:
            raise ValueError("at least one pool is needed")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names repeat: {names}")
        _check_tenants_fleet_wide(self.pools)
        fronting = self.gateway.pools
        if len(set(fronting)) != len(fronting):
            raise ValueError(f"gateway.pools repeat: {fronting}")
        for name in fronting:
            if name not in names:
                raise ValueError(f"gateway.pools: no pool named {name!r}")
        unknown = sorted(set(self.local_stack.emulator_profiles) - set(names))
        if unknown:
            raise ValueError(f"local_stack.emulator_profiles: no pools named {unknown}")
        fronted = [self.pool(n) for n in self.gateway.pools]
        if len(fronted) > 1:
            unnamed = [p.name for p in fronted if not p.models]
            if unnamed:
                raise ValueError(
                    f"gateway.pools: pools {unnamed} name no models: a gateway fronting several "
                    "pools routes by the request's model, so each must list its models"
                )
        return self

    def fronted_pools(self) -> list[PoolConfig]:
        """The pools the gateways front: `gateway.pools`, or the pool `gateway.pool` names;
        KeyError if that pool is not configured."""
        if self.gateway.pools:
            return [self.pool(n) for n in self.gateway.pools]
        return [self.pool(self.gateway.pool)]


def _check_tenants_fleet_wide(pools: list[PoolConfig]) -> None:
    """A tenant is one name and one set of keys across every pool it is in, and a key names one
    tenant in the whole fleet (the gateways find the tenant from the key before the pool)."""
    keys_of: dict[str, tuple[tuple[frozenset[str], str | None], str]] = {}
    owner_of: dict[str, str] = {}
    for pool in pools:
        for tenant in pool.tenants:
            keys = frozenset(reveal(k) for k in tenant.api_keys)
            identity = (keys, tenant.api_keys_file)
            seen = keys_of.get(tenant.name)
            if seen is not None and seen[0] != identity:
                raise ValueError(
                    f"tenant {tenant.name}: its api_keys (or api_keys_file) in pool {pool.name} "
                    f"differ from those in pool {seen[1]}: a tenant has one set of keys, given "
                    "the same way, in every pool it is in"
                )
            keys_of.setdefault(tenant.name, (identity, pool.name))
            for key in keys:
                owner = owner_of.setdefault(key, tenant.name)
                if owner != tenant.name:
                    raise ValueError(
                        f"tenants {owner} and {tenant.name} share an API key: a key names one "
                        "tenant across every pool"
                    )
