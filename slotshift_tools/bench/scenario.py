"""The benchmark scenario: one YAML file says who sends what, when, and which policies to compare.

A scenario is one server (`budget_slots`: one pool, one engine) or a fleet (`pools`: several
servers, each a pool with its models, budget and emulator profile, fronted by one gateway fleet
that routes by the request's model; each tenant names the `model` it sends and the pools it is
a tenant of, or the replica group: a model's replicas, each pool naming the group in its
`replica_group`, whose tenants are stated once as the config's `replica_groups` states them).
`bench/scenarios/fleet.yaml` is a commented fleet.

Models are frozen and validated on load, in the style of slotshift/config.py: units in field
names, a docstring per field, unknown fields refused. `bench/scenarios/seed.yaml` is the study's
setup and a commented example of every section.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from slotshift.config import (
    EngineSimConfig,
    PolicyName,
    PoolConfig,
    TenantConfig,
    divide_group,
    reveal,
    validation_problems,
)
from slotshift.config.emulator import EmulatorProfile

POOL_BASELINE = "pool"
"""The baseline that is not a policy: one unpartitioned pool, every tenant's requests in one
queue under the whole budget (the work-conserving upper bound)."""

PositiveSeconds = Annotated[float, Field(gt=0)]
NonNegativeSeconds = Annotated[float, Field(ge=0)]
PositiveRate = Annotated[float, Field(gt=0)]
TokenLength = Annotated[int, Field(ge=1)]
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]

RatioField = Literal[
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "request_goodput",
    "completed",
    "p99_ttft_ms",
    "p99_e2el_ms",
]
"""The figures the summary compares between policies (`ratios` in summary.json)."""

ValueField = Literal["reclaim_median_s", "reclaim_p90_s", "waste_percent"]
"""Figures a goal may bound within one run (times and shares, not compared between runs)."""


class ScenarioError(ValueError):
    """A scenario file that cannot be read or does not validate."""


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True
    )


class TokenRange(_Model):
    """A length drawn uniformly from a range, both ends included."""

    min_tokens: TokenLength
    """Shortest length."""

    max_tokens: TokenLength
    """Longest length."""

    @model_validator(mode="after")
    def _ordered(self) -> TokenRange:
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) is above max_tokens ({self.max_tokens})"
            )
        return self


TokenCount = TokenLength | TokenRange
"""A fixed number of tokens, or a range to draw from."""


class ClosedLoopArrival(_Model):
    """A fixed number of requests outstanding at all times: each completion is replaced at once
    (the study's back-pressured batch tenant)."""

    kind: Literal["closed_loop"]

    outstanding: Annotated[int, Field(ge=1)]
    """Requests the tenant keeps outstanding (sent and not yet answered, wherever they wait)."""


class PoissonArrival(_Model):
    """Open loop: requests arrive at exponentially distributed gaps, whatever the answers do."""

    kind: Literal["poisson"]

    rate_per_s: PositiveRate
    """Mean arrivals per second."""


class GammaArrival(_Model):
    """Open loop with gamma-distributed gaps, as `vllm bench serve --burstiness`: shape b, mean
    gap 1/rate, coefficient of variation 1/sqrt(b). b = 1 is Poisson; below 1 is burstier."""

    kind: Literal["gamma"]

    rate_per_s: PositiveRate
    """Mean arrivals per second."""

    burstiness: Annotated[float, Field(gt=0)]
    """The gamma shape b."""


class OnOffArrival(_Model):
    """Bursts: the tenant is on for on_s, then off for off_s, repeating. While on it either keeps
    `concurrency` requests outstanding (closed loop) or sends at `rate_per_s` (Poisson); while off
    it sends nothing new, and what it has outstanding finishes."""

    kind: Literal["on_off"]

    on_s: PositiveSeconds
    """Length of each burst."""

    off_s: PositiveSeconds
    """Length of each pause."""

    first_on_s: NonNegativeSeconds = 0.0
    """When the first burst starts, from the start of the load (warm-up included)."""

    concurrency: Annotated[int, Field(ge=1)] | None = None
    """Requests kept outstanding while on (closed loop); set this or rate_per_s."""

    rate_per_s: PositiveRate | None = None
    """Mean arrivals per second while on (Poisson); set this or concurrency."""

    @model_validator(mode="after")
    def _one_load(self) -> OnOffArrival:
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise ValueError("set exactly one of concurrency and rate_per_s")
        return self

    @property
    def period_s(self) -> float:
        return self.on_s + self.off_s


Arrival = Annotated[
    ClosedLoopArrival | PoissonArrival | GammaArrival | OnOffArrival, Field(discriminator="kind")
]


class Slo(_Model):
    """A tenant's service-level objectives: a request is good (counts toward request_goodput)
    when it completed and meets every objective set here, as `vllm bench serve --goodput`."""

    ttft_ms: Annotated[float, Field(gt=0)] | None = None
    """Longest time to first token."""

    tpot_ms: Annotated[float, Field(gt=0)] | None = None
    """Longest time per output token after the first (a one-token answer meets any)."""

    e2el_ms: Annotated[float, Field(gt=0)] | None = None
    """Longest end-to-end latency, from sending to the last byte."""

    @model_validator(mode="after")
    def _something_set(self) -> Slo:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise ValueError("set at least one of ttft_ms, tpot_ms, e2el_ms")
        return self


class BenchTenant(_Model):
    """One tenant: how the pool knows it and the load it sends."""

    name: Name
    """The tenant's name in the pool and in the results."""

    api_keys: Annotated[list[SecretStr], Field(min_length=1)]
    """Its API keys; the load uses the first, and in the pool baseline every key is mapped back
    to this tenant client-side."""

    floor_slots: Annotated[int, Field(ge=0)] = 1
    """Slots it always keeps (the pool's tenant floor)."""

    ceiling_slots: Annotated[int, Field(ge=0)] | None = None
    """Most slots it may hold; unset means the whole budget."""

    weight: Annotated[float, Field(gt=0)] = 1.0
    """Its share of the budget relative to the others (static gives the nominal shares)."""

    lendable_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    """How much of its nominal share the slo policy may lend out; the rest is a reserve it
    always holds (the pool's tenant setting of the same name; other policies ignore it)."""

    borrowing_limit_percent: Annotated[float, Field(ge=0)] | None = None
    """Most the slo policy lets it hold above its nominal share, in percent of that share;
    unset: up to its ceiling (the pool's tenant setting of the same name)."""

    preemptible: bool = False
    """Whether its borrowed work may be paused when a lender needs its slots back (the pool's
    tenant setting of the same name; meant for batch tenants)."""

    arrival: Arrival
    """When it sends requests."""

    prompt_tokens: TokenCount
    """Prompt length; prompts are random token ids, so the length is exact."""

    output_tokens: TokenCount
    """Output length; requests set max_tokens to it with ignore_eos, so the length is exact."""

    slo: Slo
    """Its objectives, for request_goodput; the TTFT and end-to-end ones are also the pool's
    tenant SLOs (ttft_slo_ms, e2e_slo_ms), which the slo policy steers by."""

    model: Name | None = None
    """Fleet scenarios: the model its requests name (the gateways route by it); unset: the
    scenario's `model`."""

    pools: dict[Name, PoolShare] | None = None
    """Fleet scenarios: the pools it is a tenant of, each with its bounds there (a list of
    names: the tenant's own bounds in each); set this or replica_group. Its requests may go to
    those of them that serve its model. A replica group's member is named in no tenant's pools."""

    replica_group: Name | None = None
    """Fleet scenarios: the replica group it is a tenant of (set this or pools): it is then a
    tenant of every pool whose `replica_group` names the group, stated once as the config's
    `replica_groups` states a group's tenant: floor_slots and ceiling_slots count over the whole
    group and the control plane's config divides them among the members in proportion to their
    budgets (largest remainder, a positive floor at least 1 on each member:
    slotshift/config/replica_groups.py); weight and the other settings apply on each member as
    they are."""

    @field_validator("pools", mode="before")
    @classmethod
    def _pool_names(cls, value: Any) -> Any:
        # `pools: [small-a, small-b]` is the common case: the tenant's own bounds everywhere.
        if isinstance(value, list):
            return {name: {} for name in value}
        return value

    def pool_tenant(self, pool: str) -> TenantConfig:
        """The tenant as pool `pool` of a fleet has it (its bounds there); the SLOs and keys are
        the tenant's own. KeyError if it is not a tenant of that pool by its `pools` (a replica
        group's tenant: Scenario.tenant_config)."""
        share = (self.pools or {})[pool]
        return self._config(
            floor_slots=self.floor_slots if share.floor_slots is None else share.floor_slots,
            ceiling_slots=(
                self.ceiling_slots if share.ceiling_slots is None else share.ceiling_slots
            ),
            weight=self.weight if share.weight is None else share.weight,
        )

    def group_tenant(self) -> TenantConfig:
        """The tenant as its replica group states it (the config's `replica_groups.N.tenants`):
        its own floor_slots and ceiling_slots, figures over the whole group."""
        return self._config(
            floor_slots=self.floor_slots, ceiling_slots=self.ceiling_slots, weight=self.weight
        )

    def _config(
        self, *, floor_slots: int, ceiling_slots: int | None, weight: float
    ) -> TenantConfig:
        return TenantConfig(
            name=self.name,
            api_keys=self.api_keys,
            floor_slots=floor_slots,
            ceiling_slots=ceiling_slots,
            weight=weight,
            lendable_percent=self.lendable_percent,
            borrowing_limit_percent=self.borrowing_limit_percent,
            preemptible=self.preemptible,
            ttft_slo_ms=self.slo.ttft_ms,
            e2e_slo_ms=self.slo.e2el_ms,
        )


class PoolShare(_Model):
    """A tenant's bounds in one pool of a fleet; each unset field takes the tenant's own."""

    floor_slots: Annotated[int, Field(ge=0)] | None = None
    """Slots it always keeps in this pool."""

    ceiling_slots: Annotated[int, Field(ge=0)] | None = None
    """Most slots it may hold in this pool."""

    weight: Annotated[float, Field(gt=0)] | None = None
    """Its share of this pool's budget relative to the pool's other tenants."""


class FleetPool(_Model):
    """One server of a fleet: a pool with its own budget and its own emulated engine."""

    name: Name
    """The pool's name (in the stack's config and `policies.<run>.pools.<name>`)."""

    models: Annotated[list[Name], Field(min_length=1)]
    """The model names its engine serves (the pool's `models`); pools serving the same model
    are its replicas. The first names the engine's model (`engine_sim.model_name`)."""

    budget_slots: Annotated[int, Field(ge=1)]
    """The pool's slot budget: most requests inside its engine at once."""

    replica_group: Name | None = None
    """The replica group it is a member of (the config's pool field of the same name): its
    tenants are those naming the group in their `replica_group`, their floor and ceiling slots
    divided among the group's members by budget, so a slower member with the same budget gets
    the same slots (the division counts slots, not throughput). Members list the same models.
    Unset: its tenants are those naming it in their `pools`."""

    profile: EmulatorProfile = "h200-qwen2.5-3b"
    """The emulator profile of its engine (engine_sim/profiles.py): a slower replica of a small
    model is the 7B profile serving the small model's name."""

    engine_overrides: dict[str, Any] = Field(default_factory=dict)
    """Fields of the engine_sim section for this engine only (`step_base_ms: 12`), over the
    stack's engine_sim section and the profile."""

    @model_validator(mode="after")
    def _engine_valid(self) -> FleetPool:
        # The engine's config must be one the emulator accepts (field names and bounds).
        self.engine_config(EngineSimConfig())
        return self

    def engine_config(self, base: EngineSimConfig) -> EngineSimConfig:
        """This pool's engine section: `base` with the profile, the model name and the
        overrides set; ValueError names a bad override."""
        data = {
            **base.model_dump(),
            "profile": self.profile,
            "model_name": self.models[0],
            **self.engine_overrides,
        }
        try:
            return EngineSimConfig.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"engine_overrides: {validation_problems(exc)}") from None


class PolicyRun(_Model):
    """One run of the stack: a policy (or the pool baseline) under a name the results use."""

    name: Name
    """The key of its results (`policies.<name>` in summary.json)."""

    policy: PolicyName | Literal["pool"]
    """A control-plane policy, or `pool` for the unpartitioned baseline."""

    config_overrides: dict[str, Any] = Field(default_factory=dict)
    """Extra stack config for this run only, as dotted paths (`pools.0.fast_path: false`)."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        # A bare name is the common case: `policies: [static, demand, pool]`.
        if isinstance(data, str):
            return {"name": data, "policy": data}
        return data


class Goal(_Model):
    """A target for one figure: the ratio between two runs, or one run's own value."""

    ratio: str | None = None
    """`numerator/denominator`, two run names (`demand/static`); set this or run."""

    run: Name | None = None
    """A run whose own value is bounded (`slo` with reclaim_median_s); set this or ratio."""

    field: RatioField | ValueField
    """The figure: a RatioField for a ratio, a ValueField for one run's value."""

    tenant: Name | None = None
    """The tenant whose figure is compared; unset: the total."""

    at_least: float | None = None
    """The figure must be at least this (set this or at_most)."""

    at_most: float | None = None
    """The figure must be at most this (set this or at_least)."""

    source: str = ""
    """Where the target comes from."""

    @model_validator(mode="after")
    def _one_bound(self) -> Goal:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("set exactly one of at_least and at_most")
        if (self.ratio is None) == (self.run is None):
            raise ValueError("set exactly one of ratio and run")
        if self.ratio is not None:
            if self.ratio.count("/") != 1 or not all(self.ratio.split("/")):
                raise ValueError(f"ratio {self.ratio!r}: expected NUMERATOR/DENOMINATOR run names")
            if self.field in get_args(ValueField):
                raise ValueError(f"{self.field} is bounded within one run: use run, not ratio")
        elif self.field not in get_args(ValueField):
            raise ValueError(f"{self.field} is compared between runs: use ratio, not run")
        return self

    @property
    def label(self) -> str:
        """How tables name the goal: its ratio or its run."""
        return self.ratio if self.ratio is not None else str(self.run)

    @property
    def runs(self) -> tuple[str, ...]:
        """The runs the goal reads: numerator and denominator, or the one run."""
        if self.ratio is None:
            return (str(self.run),)
        numerator, denominator = self.ratio.split("/")
        return numerator, denominator


class Scenario(_Model):
    """A whole benchmark: the pool, the tenants and their load, the runs to compare."""

    name: Name
    """The scenario's name (results go to results/<name>-<timestamp>/ by default)."""

    description: str = ""
    """What the scenario reproduces or tests."""

    seed: int
    """Seeds every random choice (arrival gaps, lengths, prompt tokens), per tenant; every run
    of the scenario gets the same draws."""

    budget_slots: Annotated[int, Field(ge=1)] | None = None
    """The pool's slot budget (a one-server scenario; set this or pools)."""

    pools: list[FleetPool] = Field(default_factory=list)
    """A fleet's servers, each a pool (set this or budget_slots): the stack's gateways front
    them all and route each request by its model. Fleet scenarios run in the twin
    (`slotshift simulate`)."""

    decision_period_s: PositiveSeconds = 2.0
    """Seconds between two decisions of the control plane."""

    gateways: Annotated[int, Field(ge=1)] = 2
    """Gateway processes; each tenant's requests are spread over them in turn."""

    tenants: Annotated[list[BenchTenant], Field(min_length=1)]
    """The tenants and their load."""

    policies: Annotated[list[PolicyRun], Field(min_length=1)]
    """The runs to compare, in order."""

    warmup_s: NonNegativeSeconds
    """Seconds of load before the steady window; nothing in them is counted."""

    steady_s: PositiveSeconds
    """Length of the steady window that every figure is measured over."""

    sample_interval_s: Annotated[float, Field(ge=0.1, le=5.0)] = 0.5
    """Seconds between two samples of the allocation, the demand and the GPU."""

    request_timeout_s: PositiveSeconds = 300.0
    """Longest a request may take, from sending to its last byte, before it counts as failed."""

    failure_backoff_s: NonNegativeSeconds = 0.5
    """Seconds a closed-loop client waits after a failed request before it sends the next (so a
    refusing gateway is not hammered)."""

    model: str | None = None
    """The model name requests carry; unset: the first model the gateway lists."""

    config_overrides: dict[str, Any] = Field(default_factory=dict)
    """Extra stack config for every run, as dotted paths (`engine_sim.profile: h200-qwen2.5-7b`)."""

    goals: list[Goal] = Field(default_factory=list)
    """Targets checked against the results."""

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [t.name for t in self.tenants]
        _no_repeats("tenant names", names)
        keys = [reveal(k) for t in self.tenants for k in t.api_keys]
        if len(set(keys)) != len(keys):
            raise ValueError("an API key is given to more than one tenant (or twice)")
        _no_repeats("run names", [p.name for p in self.policies])
        if POOL_BASELINE in names:
            raise ValueError(f"{POOL_BASELINE!r} is reserved for the pool baseline's tenant")
        runs = {p.name for p in self.policies}
        for goal in self.goals:
            unknown = [r for r in goal.runs if r not in runs]
            if unknown:
                raise ValueError(f"goal {goal.label}: no run named {unknown[0]!r}")
            if goal.tenant is not None and goal.tenant not in names:
                raise ValueError(f"goal {goal.label}: no tenant named {goal.tenant!r}")
        if self.pools:
            self._check_fleet()
            return self
        if self.budget_slots is None:
            raise ValueError("set budget_slots (one server) or pools (a fleet)")
        fleet_only = [
            t.name
            for t in self.tenants
            if t.pools is not None or t.model is not None or t.replica_group is not None
        ]
        if fleet_only:
            raise ValueError(
                f"tenants {fleet_only} set model, pools or replica_group, which only a fleet "
                "scenario (pools) takes"
            )
        # The pool must be one the control plane accepts: floors within the budget, etc.
        PoolConfig(
            name="bench",
            budget_slots=self.budget_slots,
            tenants=[
                TenantConfig(
                    name=t.name,
                    floor_slots=t.floor_slots,
                    ceiling_slots=t.ceiling_slots,
                    weight=t.weight,
                    lendable_percent=t.lendable_percent,
                    borrowing_limit_percent=t.borrowing_limit_percent,
                    preemptible=t.preemptible,
                )
                for t in self.tenants
            ],
        )
        return self

    def _check_fleet(self) -> None:
        if self.budget_slots is not None:
            raise ValueError("set budget_slots (one server) or pools (a fleet), not both")
        _no_repeats("pool names", [p.name for p in self.pools])
        pools = {p.name: p for p in self.pools}
        self._check_groups()
        for tenant in self.tenants:
            if tenant.pools and tenant.replica_group is not None:
                raise ValueError(f"tenant {tenant.name}: set pools or replica_group, not both")
            if tenant.replica_group is not None:
                if not self.group_members(tenant.replica_group):
                    raise ValueError(
                        f"tenant {tenant.name}: no pool names replica group "
                        f"{tenant.replica_group!r} as its replica_group"
                    )
            elif not tenant.pools:
                raise ValueError(
                    f"tenant {tenant.name}: a fleet's tenant names its pools (or its replica_group)"
                )
            else:
                unknown = sorted(set(tenant.pools) - set(pools))
                if unknown:
                    raise ValueError(f"tenant {tenant.name}: no pools named {unknown}")
                members = sorted(p for p in tenant.pools if pools[p].replica_group is not None)
                if members:
                    raise ValueError(
                        f"tenant {tenant.name}: pools {members} are members of a replica group, "
                        "whose tenants name the group in replica_group instead"
                    )
            model = self.model_of(tenant)
            if model is None:
                raise ValueError(f"tenant {tenant.name}: set its model (or the scenario's)")
            served = self.tenant_pools(tenant)
            if not any(model in pools[p].models for p in served):
                raise ValueError(
                    f"tenant {tenant.name}: none of its pools {sorted(served)} serves "
                    f"its model {model!r}"
                )
            if isinstance(tenant.arrival, OnOffArrival):
                # Reclaim is measured against one pool's nominal share; a fleet has several.
                raise ValueError(f"tenant {tenant.name}: a fleet's tenants take no on_off load")
        for pool in self.pools:
            # Each pool must be one the control plane accepts with its tenants' bounds there (a
            # member's: the group's bounds divided onto it, as the config's loader divides them).
            PoolConfig(
                name=pool.name,
                budget_slots=pool.budget_slots,
                models=pool.models,
                tenants=[self.tenant_config(t, pool.name) for t in self.pool_tenants(pool.name)],
            )

    def _check_groups(self) -> None:
        """Each replica group named by the pools: its members serve the same models (they are
        replicas of one model) and some tenant names it (the config refuses a group without
        tenants)."""
        for group in self.replica_group_names:
            members = self.group_members(group)
            models = {frozenset(p.models) for p in members}
            if len(models) > 1:
                raise ValueError(
                    f"replica group {group!r}: its members are replicas of one model and must "
                    f"list the same models: { ({p.name: p.models for p in members}) }"
                )
            if not self.group_tenants(group):
                raise ValueError(
                    f"replica group {group!r}: no tenant names it as its replica_group"
                )

    @property
    def fleet(self) -> bool:
        """Whether this is a fleet scenario (several pools behind one gateway fleet)."""
        return bool(self.pools)

    @property
    def total_budget_slots(self) -> int:
        """The slots of every server together (the one pool's budget, or the fleet's sum)."""
        if self.budget_slots is not None:
            return self.budget_slots
        return sum(p.budget_slots for p in self.pools)

    def model_of(self, tenant: BenchTenant) -> str | None:
        """The model `tenant`'s requests name: its own, else the scenario's."""
        return tenant.model if tenant.model is not None else self.model

    def pool_tenants(self, pool: str) -> list[BenchTenant]:
        """The tenants of fleet pool `pool`, in the scenario's order: those naming it in their
        `pools`, or, for a replica group's member, those naming its group (a pool without
        tenants is refused by the pool's own validation). KeyError for no such pool."""
        group = self.fleet_pool(pool).replica_group
        if group is not None:
            return self.group_tenants(group)
        return [t for t in self.tenants if t.pools is not None and pool in t.pools]

    def tenant_pools(self, tenant: BenchTenant) -> list[str]:
        """The pools `tenant` is a tenant of: its `pools`, or its replica group's members."""
        if tenant.replica_group is not None:
            return [p.name for p in self.group_members(tenant.replica_group)]
        return list(tenant.pools or {})

    def tenant_config(self, tenant: BenchTenant, pool: str) -> TenantConfig:
        """`tenant` as fleet pool `pool` has it in the control plane's config: its bounds there
        (BenchTenant.pool_tenant), or, in a replica group's member, its group figures divided
        onto that member by the members' budgets (slotshift.config.divide_group, the division
        the config's loader makes). KeyError if it is not a tenant of that pool."""
        if tenant.replica_group is None:
            return tenant.pool_tenant(pool)
        if self.fleet_pool(pool).replica_group != tenant.replica_group:
            raise KeyError(pool)
        budgets = {p.name: p.budget_slots for p in self.group_members(tenant.replica_group)}
        return divide_group([tenant.group_tenant()], budgets)[pool][0]

    @property
    def replica_group_names(self) -> list[str]:
        """The replica groups the fleet's pools name, in the order they are first named."""
        return list(dict.fromkeys(p.replica_group for p in self.pools if p.replica_group))

    def group_members(self, group: str) -> list[FleetPool]:
        """The pools naming `group` as their replica_group, in the pools' order."""
        return [p for p in self.pools if p.replica_group == group]

    def group_tenants(self, group: str) -> list[BenchTenant]:
        """The tenants naming `group` as their replica_group, in the scenario's order."""
        return [t for t in self.tenants if t.replica_group == group]

    def fleet_pool(self, name: str) -> FleetPool:
        """The fleet pool called `name`; KeyError if there is none."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def tenant(self, name: str) -> BenchTenant:
        """The tenant called `name`; KeyError if there is none."""
        for tenant in self.tenants:
            if tenant.name == name:
                return tenant
        raise KeyError(name)

    def run(self, name: str) -> PolicyRun:
        """The run called `name`; KeyError if there is none."""
        for run in self.policies:
            if run.name == name:
                return run
        raise KeyError(name)


def _no_repeats(what: str, values: list[str]) -> None:
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{what} repeat: {repeated}")


def parse_scenario(data: Mapping[str, Any], *, source: str = "<scenario>") -> Scenario:
    """Validate a parsed document; ScenarioError names each bad field."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {validation_problems(exc)}") from exc


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{path}: expected a mapping at the top level")
    return parse_scenario(data, source=str(path))
