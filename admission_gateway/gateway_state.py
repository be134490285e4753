"""What one gateway enforces and observes: per-tenant admission, limits, allocation version.

The HTTP side admits through it, the control stream applies allocations to it and reports from
it, /metrics reads it. It holds no I/O and speaks no protocol: the control client turns protobuf
messages into `TenantLimit`s, and the tenants' demand (slotshift.demand.TenantDemand, built here)
into protobuf through slotshift.wire.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from opentelemetry.trace import SpanContext

from admission_gateway.admission import TenantAdmission
from admission_gateway.latency_window import LatencyWindow
from admission_gateway.token_usage import TokenTotals
from slotshift.apportion import nominal_shares
from slotshift.clock import Clock
from slotshift.config import GatewayConfig, PoolConfig
from slotshift.demand import TenantDemand

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TenantLimit:
    """One tenant's limits at this gateway, as an allocation update carries them."""

    tenant: str
    target_slots: int
    """This gateway's part of the tenant's pool-wide limit."""
    limit_slots: int
    """What the gateway may admit now (at most target_slots)."""
    pause_above_slots: int | None = None
    """Pause the tenant's running requests until at most this many run; None: pause nothing."""


class TenantState:
    """One tenant at this gateway: its admission, its target and its recent latencies."""

    def __init__(
        self,
        name: str,
        admission: TenantAdmission,
        *,
        pool: str,
        target_slots: int,
        new_window: Callable[[], LatencyWindow],
        preemptible: bool = False,
    ) -> None:
        self.name = name
        self.pool = pool
        """The pool whose slots this is (a gateway may front several)."""
        self.admission = admission
        self.preemptible = preemptible
        """Whether the tenant's resumable requests may be paused (its config's `preemptible`)."""
        self.output_tokens_total = 0
        """Output tokens the engine generated for the requests the gateway reads (preemptible
        ones), since start: the base of the pool's waste share."""
        self.discarded_output_tokens_total = 0
        """Output tokens thrown away because a paused request had to start again."""
        self.recomputed_prompt_tokens_total = 0
        """Prompt tokens recomputed on resume that were no prefix-cache hits."""
        self.moved_out_total = 0
        """Requests whose engine here was lost and that went on at another replica."""
        self.moved_in_total = 0
        """Requests that came here from another replica whose engine was lost."""
        self.tokens: dict[str, TokenTotals] = {}
        """model -> the tenant's tokens for it here since start (gateway.count_tokens): what its
        answers' usage said, or what its cut streams delivered (token_usage.py)."""
        self.target_slots = target_slots
        """This gateway's part of the tenant's pool-wide limit (shown in metrics)."""
        self.decision: SpanContext | None = None
        """The span of the control-plane decision whose allocation set the limit in force (None
        on the fallback split, or when the control plane does not trace): requests admitted under
        the limit link to it."""
        self.ttft = new_window()
        """Time to first token of recent streamed requests, from arrival at the gateway."""
        self.e2e = new_window()
        """End-to-end latency of recent successful requests, from arrival at the gateway."""

    def count_tokens(self, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        """One request's tokens, for `model` (the routed or the named one)."""
        totals = self.tokens.get(model)
        if totals is None:
            totals = self.tokens[model] = TokenTotals()
        totals.prompt_tokens_total += prompt_tokens
        totals.completion_tokens_total += completion_tokens

    @property
    def waste_tokens_total(self) -> int:
        """Tokens lost to pauses (docs/preemption.md); charged to the pool, not the tenant."""
        return self.discarded_output_tokens_total + self.recomputed_prompt_tokens_total

    def demand(self) -> TenantDemand:
        """The tenant's demand here now: its admission's counts, its latency windows' summaries
        (milliseconds) and its token counters."""
        counts = self.admission.counts()
        return TenantDemand(
            tenant=self.name,
            in_flight=counts.in_flight,
            queued=counts.queued,
            admitted_total=counts.admitted_total,
            completed_total=counts.completed_total,
            rejected_total=counts.rejected_total,
            limit_slots=counts.limit_slots,
            ttft=self.ttft.percentiles(),
            e2e=self.e2e.percentiles(),
            queue_wait=self.admission.queue_wait.percentiles(),
            paused=counts.paused,
            output_tokens_total=self.output_tokens_total,
            waste_tokens_total=self.waste_tokens_total,
            pauses_total=counts.pauses_total,
        )


def fallback_limits(pool: PoolConfig, replicas: int) -> dict[str, int]:
    """The static split a gateway enforces before it first hears from the control plane.

    Each tenant's nominal share divided by the replicas assumed, rounded down, so that that many
    gateways together stay within the pool's budget.
    """
    return {tenant: share // replicas for tenant, share in nominal_shares(pool).items()}


class GatewayState:
    """The tenants of one pool at one gateway, and the allocation version in force."""

    def __init__(self, pool: PoolConfig, gateway: GatewayConfig, clock: Clock) -> None:
        self.pool_name = pool.name
        self.queue_started = asyncio.Event()
        """Set when a tenant's requests start to queue here; the control client clears it when it
        reports the demand."""
        limits = fallback_limits(pool, gateway.fallback_replicas)
        preemptible = {t.name for t in pool.tenants if t.preemptible and pool.preemption.enabled}
        self._fallback = dict(limits)
        self._on_controlplane_loss = gateway.on_controlplane_loss

        def new_window() -> LatencyWindow:
            return LatencyWindow(
                clock,
                max_samples=gateway.latency_window_samples,
                max_age_s=gateway.latency_window_s,
            )

        def new_tenant(name: str, limit: int) -> TenantState:
            return TenantState(
                name,
                TenantAdmission(
                    name,
                    limit,
                    queue_max_depth=gateway.queue_max_depth,
                    queue_timeout_s=gateway.queue_timeout_s,
                    clock=clock,
                    queue_wait_window=new_window(),
                    on_queue_started=self.queue_started.set,
                    max_pauses_per_request=pool.preemption.max_pauses_per_request,
                ),
                pool=pool.name,
                target_slots=limit,
                new_window=new_window,
                preemptible=name in preemptible,
            )

        self._new_tenant = new_tenant
        self._tenants: dict[str, TenantState] = {
            name: new_tenant(name, limit) for name, limit in limits.items()
        }
        self._applied_version = 0
        self._epoch = 0
        self.prompt_estimate_fallbacks_total = 0
        """Requests of a pool weighing prompts by the engine's /tokenize that were weighed by
        their length instead, because the engine gave no count (pools[].request_cost)."""
        self.controlplane_connected = False
        """Whether the control stream is up now (set by the control client)."""

    @property
    def tenants(self) -> Mapping[str, TenantState]:
        return self._tenants

    @property
    def applied_version(self) -> int:
        """The allocation version enforced now; 0 while on the fallback split."""
        return self._applied_version

    def room(self, tenant: str) -> tuple[int, int] | None:
        """What the router (routing.Front.room) reads of `tenant` here: (its limit less what it
        runs and queues, what it runs), in slots; None when this pool does not know the tenant. One
        function for the proxy's PoolFront and the twin's fronts, so that both route alike."""
        held = self._tenants.get(tenant)
        if held is None:
            return None
        admission = held.admission
        return admission.limit_slots - admission.in_flight - admission.queued, admission.in_flight

    @property
    def epoch(self) -> int:
        """The newest leader epoch an applied allocation carried (0: none yet, or a control
        plane that runs no election)."""
        return self._epoch

    def add_tenant(self, name: str) -> bool:
        """Know tenant `name` (added at run time), with no slots until an allocation gives it
        some; False if it is known already. Tenants are never forgotten: a removed one keeps its
        state while its running requests finish, and no key admits it any more."""
        if name in self._tenants:
            return False
        self._tenants[name] = self._new_tenant(name, 0)
        return True

    def controlplane_lost(self) -> bool:
        """The stream to the control plane broke. With `on_controlplane_loss: fallback`, cut
        every tenant to at most its static fallback split (running requests finish); returns
        whether anything was cut."""
        if self._on_controlplane_loss != "fallback":
            return False
        cut = False
        for name, tenant in self._tenants.items():
            limit = tenant.admission.limit_slots
            conservative = min(limit, self._fallback.get(name, 0))
            if conservative < limit:
                tenant.admission.resize(conservative)
                cut = True
        return cut

    def apply_allocation(
        self,
        version: int,
        limits: Iterable[TenantLimit],
        *,
        decision: SpanContext | None = None,
        delta: bool = False,
        epoch: int = 0,
    ) -> bool:
        """Enforce the limits of allocation `version` of leader `epoch`; False (and no change)
        if it is not newer by (epoch, version): an epoch older than the newest applied is
        refused whatever its version (a deposed leader's), a newer one is taken whatever its
        version (a new leader numbers its own).

        A whole update (`delta` false) names every tenant: one it does not name gets 0 slots,
        the control plane gave its share to others. A delta names only the tenants whose limits
        changed; the others keep theirs. Limits for tenants this gateway does not know are
        ignored with a warning. `decision` is the span of the decision the allocation comes
        from, if it was traced.
        """
        if (epoch, version) <= (self._epoch, self._applied_version):
            return False
        by_tenant: dict[str, TenantLimit] = {}
        for limit in limits:
            if limit.tenant not in self._tenants:
                logger.warning(
                    "allocation %d names tenant %r, unknown to pool %s; ignored",
                    version,
                    limit.tenant,
                    self.pool_name,
                )
                continue
            by_tenant[limit.tenant] = limit
        for name, tenant in self._tenants.items():
            named = by_tenant.get(name)
            if named is None and delta:
                continue
            limit = named or TenantLimit(name, target_slots=0, limit_slots=0)
            tenant.admission.resize(max(0, limit.limit_slots))
            pause_above = limit.pause_above_slots
            tenant.admission.set_pause_above(
                None if pause_above is None or not tenant.preemptible else max(0, pause_above)
            )
            tenant.target_slots = max(0, limit.target_slots)
            tenant.decision = decision
        self._applied_version = version
        self._epoch = epoch
        return True

    def demand(self) -> list[TenantDemand]:
        """Every tenant's demand now, in configuration order."""
        return [tenant.demand() for tenant in self._tenants.values()]

    def close(self) -> None:
        """Admit nothing more; queued requests are turned away."""
        for tenant in self._tenants.values():
            tenant.admission.close()

    async def wait_idle(self) -> None:
        """Return once no tenant has a request running."""
        for tenant in self._tenants.values():
            await tenant.admission.wait_idle()
