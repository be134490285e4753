"""What a policy sees: an immutable snapshot of one pool at one instant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Latency:
    """Percentiles of a recent window, in milliseconds; count 0 means unknown."""

    count: int = 0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's load, summed over the pool's gateways."""

    in_flight: int = 0
    queued: int = 0
    ttft: Latency = Latency()
    e2e: Latency = Latency()

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
