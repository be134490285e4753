"""A pool and its tenants: the slot budget, who shares it, and the bounds on each share."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, model_validator

from slotshift.config.base import ConfigModel, Name, PositiveSeconds
from slotshift.config.policies import AgentPolicyConfig, PolicyName, SloPolicyConfig
from slotshift.config.preemption import PreemptionConfig
from slotshift.config.request_cost import RequestCostConfig
from slotshift.config.tls import ClientTlsConfig

ModelName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^\S+$")]
"""A model name as OpenAI clients send it (`Qwen/Qwen2.5-3B-Instruct`): no white space."""


class TenantConfig(ConfigModel):
    """One tenant of a pool: who it is, how it authenticates, and the bounds on its slots."""

    name: Name
    """The tenant's name, as it appears in allocations, metrics and traces."""

    api_keys: list[SecretStr] = Field(default_factory=list)
    """API keys (`Authorization: Bearer KEY`) that identify this tenant at the gateways."""

    api_keys_file: str | None = None
    """A file with one API key per line, such as a mounted Kubernetes Secret; its keys are added to
    api_keys when the config is loaded. A relative path is relative to the config file's folder;
    blank lines and lines starting with `#` are ignored."""

    floor_slots: Annotated[int, Field(ge=0)] = 1
    """Slots the tenant always keeps, whatever its demand."""

    ceiling_slots: Annotated[int, Field(ge=0)] | None = None
    """Most slots the tenant may hold pool-wide; unset means the whole budget."""

    weight: Annotated[float, Field(gt=0)] = 1.0
    """The tenant's share of the budget relative to the other tenants (its nominal share), and how
    strongly its demand counts when the demand policy divides contended slots."""

    lendable_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    """slo policy: the part of the tenant's nominal share that may be lent to others while it does
    not use it, in percent (Kubernetes APF's lendablePercent); the rest is a reserve never lent
    (Kueue's lendingLimit counted from the other side)."""

    borrowing_limit_percent: Annotated[float, Field(ge=0)] | None = None
    """slo policy: most the tenant may borrow above its nominal share, in percent of that share
    (APF's borrowingLimitPercent); unset means up to its ceiling."""

    ttft_slo_ms: Annotated[float, Field(gt=0)] | None = None
    """Target p99 time to first token, measured at the gateway from arrival (queueing included)."""

    e2e_slo_ms: Annotated[float, Field(gt=0)] | None = None
    """Target p99 end-to-end latency, measured at the gateway from arrival."""

    preemptible: bool = False
    """Whether the tenant's borrowed work may be paused when a lender needs its slots back, and
    resumed later without loss (docs/preemption.md): meant for batch tenants. Only requests above
    the tenant's own nominal share are ever paused. A tenant that is not preemptible borrows only
    what the other tenants' reserves leave free, so that lending to it never costs a lender its
    reserve."""

    @model_validator(mode="after")
    def _floor_within_ceiling(self) -> TenantConfig:
        if self.ceiling_slots is not None and self.floor_slots > self.ceiling_slots:
            raise ValueError(
                f"floor_slots ({self.floor_slots}) is above ceiling_slots ({self.ceiling_slots})"
            )
        return self


class PoolConfig(ConfigModel):
    """One pool: one inference server (one vLLM engine) with its own fixed slot budget."""

    name: Name
    """The pool's name; every API message names its pool."""

    budget_slots: Annotated[int, Field(ge=1)]
    """Slots the pool lets into the engine at once, over all tenants and gateways: one per
    request, or, with `request_cost` set, `request_cost.tokens_per_slot` tokens of expected work
    each (a request then holds one or more)."""

    policy: PolicyName = "demand"
    """The allocation policy that moves slots between this pool's tenants."""

    decision_period_s: PositiveSeconds = 2.0
    """Seconds between two allocation decisions."""

    engine_url: str = "http://127.0.0.1:8000"
    """Base URL of the engine's OpenAI-compatible API (the gateways proxy to it)."""

    engine_tls: ClientTlsConfig | None = None
    """How the gateways check an https engine_url (vLLM's --ssl-certfile), with a client
    certificate if the engine requires one (--ssl-ca-certs, --ssl-cert-reqs 2); unset: the
    system's roots for https."""

    engine_api_key_file: str | None = None
    """A file holding the engine's API key (its first line that is neither blank nor a `#`
    comment), such as a mounted Kubernetes
    Secret: the gateways send it as `Authorization: Bearer KEY` on every call to this pool's
    engine (vLLM's --api-key or VLLM_API_KEY, the emulator's engine_sim.api_key_file), and
    nobody else needs it (the tenants' own keys never go past the gateways). Read by the
    gateways only, when they start; a relative path is relative to the config file's folder.
    Unset: no key is sent, for an engine that requires none."""

    fast_path: bool = True
    """Decide at once, not at the next period, when a tenant's queue grows while it holds less
    than its nominal share (so that lent slots start coming back without delay)."""

    fast_path_min_interval_s: PositiveSeconds = 0.02
    """Least time between the starts of two decisions the fast path triggers. A burst reaches
    the gateways a few milliseconds apart, so the first decision may see only part of it; the
    next one, this long after, sees the rest (at 0.1 s the lender's p99 TTFT in
    bench/scenarios/burst-full-share.yaml was 173 ms, at 0.02 s 101 ms). At most
    1 / this many fast-path decisions a second."""

    fast_path_max_cores: Annotated[float, Field(gt=0, le=1)] = 0.05
    """Most of one CPU core the pool's fast-path decisions keep busy: after a decision that took
    d seconds the next the fast path asks for waits at least d / this minus d (and at least
    fast_path_min_interval_s). A decision of a few tenants takes about a millisecond and is
    held back by the interval alone; one of 1,000 tenants on 100 gateways takes about 20 ms
    (its snapshot, the policy, the re-grant), so the fast path, which a pool that large asks
    for all the time, decides about every 0.4 s instead of taking a fifth of the process's
    core (bench-scale 1000x100: 0.54 of a core at 0.1, 0.49 at 0.05). Period decisions are
    not held back."""

    models: list[ModelName] = Field(default_factory=list)
    """The model names the pool's engine serves (what a request's `model` says; vLLM's
    `--served-model-name`). The gateways send a request to a pool that serves its model; pools
    that serve the same model are replicas of it. Empty: the pool serves whatever model a request
    names, which only a gateway fronting this pool alone allows."""

    replica_group: Name | None = None
    """The replica group (top-level `replica_groups`) this pool is a replica in: the pool then
    lists no tenants, and takes the group's, their floor and ceiling slots divided among the
    group's members by budget (slotshift/config/replica_groups.py). Its budget stays its own.
    Unset: the pool lists its own tenants."""

    tenants: list[TenantConfig] = Field(default_factory=list)
    """The tenants sharing the budget: the tenants that may use the pool's models. A tenant is
    one name and one set of API keys across every pool it is in (its bounds and share are the
    pool's own). A replica group's member lists none: the loader fills them in."""

    slo_policy: SloPolicyConfig = SloPolicyConfig()
    """Settings of the slo policy (used when `policy` is slo, or as the agent's fallback)."""

    agent_policy: AgentPolicyConfig = AgentPolicyConfig()
    """Settings of the agent policy (used when `policy` is agent)."""

    preemption: PreemptionConfig = PreemptionConfig()
    """How borrowed work of preemptible tenants is paused and resumed (docs/preemption.md)."""

    request_cost: RequestCostConfig | None = None
    """Weigh each request by its expected size (prompt plus max_tokens) in slots of
    `tokens_per_slot` tokens, so that one tenant's long prompts cannot crowd out another's short
    ones under the same slot count (docs/operations.md, "Token-weighted slots"). Unset: every
    request costs one slot. The engine's own max_num_seqs still caps the requests it runs."""

    def ceiling_of(self, tenant: TenantConfig) -> int:
        """The tenant's effective ceiling: its own, or the whole budget."""
        if tenant.ceiling_slots is None:
            return self.budget_slots
        return min(tenant.ceiling_slots, self.budget_slots)

    @model_validator(mode="after")
    def _budget_fits_bounds(self) -> PoolConfig:
        if not self.tenants:
            raise ValueError("a pool needs at least one tenant")
        names = [t.name for t in self.tenants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tenant names repeat: {duplicates}")
        repeated = sorted({m for m in self.models if self.models.count(m) > 1})
        if repeated:
            raise ValueError(f"models repeat: {repeated}")
        floors = sum(t.floor_slots for t in self.tenants)
        if floors > self.budget_slots:
            raise ValueError(
                f"tenants' floor_slots sum to {floors}, above budget_slots ({self.budget_slots})"
            )
        ceilings = sum(self.ceiling_of(t) for t in self.tenants)
        if ceilings < self.budget_slots:
            raise ValueError(
                f"tenants' ceiling_slots sum to {ceilings}, below budget_slots "
                f"({self.budget_slots}): the budget could not be handed out in full"
            )
        return self
