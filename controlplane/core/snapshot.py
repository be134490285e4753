"""What a policy sees: an immutable snapshot of one pool at one instant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slotshift.demand import LatencySummary


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's load, summed over the pool's gateways (each gateway's part is the
    `slotshift.demand.TenantDemand` it last reported)."""

    in_flight: int = 0
    queued: int = 0
    ttft: LatencySummary = LatencySummary()
    """The gateways' windows merged: p50 weighted by count, p90 and p99 the worst."""
    e2e: LatencySummary = LatencySummary()
    """As `ttft`."""
    admitted_total: int = 0
    """The gateways' counters summed, each since that gateway started (shown, not decided on)."""
    completed_total: int = 0
    """As `admitted_total`."""
    rejected_total: int = 0
    """As `admitted_total`."""
    demand_age_s: float | None = None
    """Wall-clock seconds since the oldest of the summed figures was observed at its gateway;
    None when none carries an observation time."""

    @property
    def demand_slots(self) -> int:
        """Slots the tenant could use right now: what it runs plus what waits."""
        return self.in_flight + self.queued


@dataclass(frozen=True, slots=True)
class TelemetryView:
    """The engine and GPU as the last telemetry report showed them."""

    age_s: float
    """Seconds between the report and the snapshot."""
    fresh: bool
    kv_cache_usage_perc: float = 0.0
    num_requests_running: float = 0.0
    num_requests_waiting: float = 0.0
    gpu_available: bool = False
    gpu_emulated: bool = False
    gpu_utilization_pct: float = 0.0


@dataclass(frozen=True, slots=True)
class Advice:
    """An outside decision function's answer, gathered before the policy runs (the policy itself
    does no I/O). Exactly one of `limits` and `error` is set."""

    limits: Mapping[str, object] | None = None
    """The proposed tenant limits, as the advisor parsed them: not yet validated."""
    reason: str = ""
    error: str | None = None
    """Why there is no usable answer: late, failed, unparseable."""
    latency_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Everything a policy may base a decision on. `now_s` is the only time it may use."""

    now_s: float
    tenants: Mapping[str, TenantLoad]
    current_limits: Mapping[str, int]
    """The tenant limits in force (the previous decision's outputs)."""
    telemetry: TelemetryView | None = None
    gateways_connected: int = 0
    advice: Advice | None = None
    """The agent's answer for this decision, when the policy asked for one."""
