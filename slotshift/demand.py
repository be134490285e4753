"""One tenant's demand at one gateway: the one shape it has from admission to the policy.

The gateway builds a `TenantDemand` per tenant from its admission counters, its latency windows
and its token counts; it travels as the wire's `slotshift.v1.TenantDemand` (the same fields, by
the same names; slotshift/wire.py converts, nothing else does); the control plane keeps the last
one each gateway reported and sums them over the pool for the policy (`TenantLoad`).

Latencies are milliseconds all the way (`LatencySummary`), as on the wire. Pure stdlib: the
pure cores (controlplane.core, admission) import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles of the latencies in a recent window, in milliseconds."""

    count: int = 0
    """Observations in the window; 0 means the percentiles are unknown (and all 0)."""
    p50_ms: float = 0.0
    """Median, by nearest rank."""
    p90_ms: float = 0.0
    """90th percentile, by nearest rank."""
    p99_ms: float = 0.0
    """99th percentile, by nearest rank."""


@dataclass(frozen=True, slots=True)
class TenantDemand:
    """One tenant's demand as one gateway saw it at one moment.

    Counts are never negative; the `_total` counters count since the gateway started (a
    restarted gateway starts again from 0).
    """

    tenant: str
    in_flight: int = 0
    """Slots held by requests admitted and not yet finished (a paused request counts until it
    has left the engine): one a request, unless the pool weighs requests (pools[].request_cost),
    where a request holds what its size costs."""
    queued: int = 0
    """Slots the requests waiting in the gateway's queue (paused ones included) ask for; one a
    request unless the pool weighs requests."""
    admitted_total: int = 0
    """Requests admitted (a resumed request is not admitted again)."""
    completed_total: int = 0
    """Admitted requests that have finished, whatever their outcome."""
    rejected_total: int = 0
    """Requests turned away before admission (queue full, queue timeout, shutting down)."""
    limit_slots: int = 0
    """The limit the gateway enforced for the tenant at that moment."""
    ttft: LatencySummary = LatencySummary()
    """Time to first token of recent streamed requests, from arrival at the gateway."""
    e2e: LatencySummary = LatencySummary()
    """End-to-end latency of recent successful requests, from arrival at the gateway."""
    queue_wait: LatencySummary = LatencySummary()
    """Time recently admitted requests waited in the queue (0 for those admitted at once)."""
    paused: int = 0
    """Of `queued`, the slots of the paused requests waiting to resume."""
    output_tokens_total: int = 0
    """Output tokens the engine generated for the requests the gateway reads (preemptible
    tenants' requests): the base of the pool's waste share (docs/preemption.md)."""
    waste_tokens_total: int = 0
    """Tokens lost to pauses: output discarded by restarts plus prompt tokens recomputed on
    resume that were not prefix-cache hits. Charged to the pool, not the tenant."""
    pauses_total: int = 0
    """Times a running request of the tenant was paused at the gateway."""
