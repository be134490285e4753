"""The whole configuration file: its pools and each service's section."""

from __future__ import annotations

from pydantic import model_validator

from slotshift.config.base import ConfigModel
from slotshift.config.emulator import EngineSimConfig
from slotshift.config.local_stack import LocalStackConfig
from slotshift.config.pools import PoolConfig
from slotshift.config.services import AgentConfig, ControlPlaneConfig, GatewayConfig


class SlotshiftConfig(ConfigModel):
    """The whole configuration file."""

    pools: list[PoolConfig]
    """The pools the control plane manages."""

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

    @model_validator(mode="after")
    def _pools_unique(self) -> SlotshiftConfig:
        if not self.pools:
            raise ValueError("at least one pool is needed")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names repeat: {names}")
        return self
