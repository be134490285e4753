"""Many tenants' demand at one gateway, as columns: how the control plane reads a report.

The same figures as `slotshift.demand.TenantDemand` (the one shape of a tenant's demand), held
as two arrays over the named tenants instead of one object each, so that a report of 1,000
tenants is read into the control plane's rows in a few array operations and leaves no object
per figure behind (a pool of 1,000 tenants on 100 gateways held 100,000 of them, and the
garbage collector walked them all). Only the figures the control plane reads are kept: the
queue-wait window and the pause counters stay at the gateway's own metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from slotshift.demand import LatencySummary, TenantDemand

IN_FLIGHT, QUEUED, ADMITTED, COMPLETED, REJECTED, LIMIT, OUTPUT_TOKENS, WASTE_TOKENS = range(8)
TTFT_COUNT, E2E_COUNT = 8, 9
COUNTS = 10
"""The rows of `DemandColumns.counts`: whole numbers, never negative."""

TTFT_P50, TTFT_P90, TTFT_P99, E2E_P50, E2E_P90, E2E_P99 = range(6)
LATENCIES = 6
"""The rows of `DemandColumns.latencies`: milliseconds, as `LatencySummary`."""


class _Window(Protocol):
    """A latency window: a LatencySummary, or the wire's."""

    @property
    def count(self) -> int: ...
    @property
    def p50_ms(self) -> float: ...
    @property
    def p90_ms(self) -> float: ...
    @property
    def p99_ms(self) -> float: ...


class TenantFigures(Protocol):
    """One tenant's figures by TenantDemand's names: a TenantDemand, or the wire's message of
    it (the same fields)."""

    @property
    def tenant(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def admitted_total(self) -> int: ...
    @property
    def completed_total(self) -> int: ...
    @property
    def rejected_total(self) -> int: ...
    @property
    def limit_slots(self) -> int: ...
    @property
    def output_tokens_total(self) -> int: ...
    @property
    def waste_tokens_total(self) -> int: ...
    @property
    def ttft(self) -> _Window: ...
    @property
    def e2e(self) -> _Window: ...


@dataclass(frozen=True, slots=True, eq=False)
class DemandColumns:
    """The figures of `tenants` (one column each, in that order) as one gateway saw them."""

    tenants: tuple[str, ...]
    counts: NDArray[np.int64]
    """(COUNTS, len(tenants)): in flight, queued, admitted, completed, rejected, the limit it
    enforced, output and waste tokens, and the sample counts of the TTFT and end-to-end
    windows."""
    latencies: NDArray[np.float64]
    """(LATENCIES, len(tenants)): p50, p90, p99 of TTFT, then of end-to-end latency; 0 where
    the window has no samples."""

    @classmethod
    def of(cls, demands: Iterable[TenantFigures]) -> DemandColumns:
        """The columns of `demands` (a tenant named twice: the later figures), checked as a
        peer's are."""
        by_tenant = {d.tenant: d for d in demands}
        counts = np.array(
            [
                (
                    d.in_flight,
                    d.queued,
                    d.admitted_total,
                    d.completed_total,
                    d.rejected_total,
                    d.limit_slots,
                    d.output_tokens_total,
                    d.waste_tokens_total,
                    d.ttft.count,
                    d.e2e.count,
                )
                for d in by_tenant.values()
            ],
            dtype=np.int64,
        ).reshape(len(by_tenant), COUNTS)
        latencies = np.array(
            [
                (
                    d.ttft.p50_ms,
                    d.ttft.p90_ms,
                    d.ttft.p99_ms,
                    d.e2e.p50_ms,
                    d.e2e.p90_ms,
                    d.e2e.p99_ms,
                )
                for d in by_tenant.values()
            ],
            dtype=np.float64,
        ).reshape(len(by_tenant), LATENCIES)
        return cls.checked(tuple(by_tenant), counts.T, latencies.T)

    @classmethod
    def checked(
        cls, tenants: tuple[str, ...], counts: NDArray[np.int64], latencies: NDArray[np.float64]
    ) -> DemandColumns:
        """Columns from a peer's figures, which are not trusted to keep the contract: a negative
        count reads as 0, and a window without samples has percentiles of 0."""
        counts = np.maximum(counts, 0)
        latencies = np.array(latencies, dtype=np.float64)
        # Masked writes only where a window is empty: on every report and acknowledgement, and
        # most windows hold samples.
        if not counts[TTFT_COUNT].all():
            latencies[TTFT_P50 : TTFT_P99 + 1, counts[TTFT_COUNT] == 0] = 0.0
        if not counts[E2E_COUNT].all():
            latencies[E2E_P50 : E2E_P99 + 1, counts[E2E_COUNT] == 0] = 0.0
        return cls(tenants, counts, latencies)

    def __len__(self) -> int:
        return len(self.tenants)

    def demands(self) -> list[TenantDemand]:
        """The figures as TenantDemands, tenant by tenant (the fields the columns keep)."""
        result = []
        rows = zip(self.tenants, self.counts.T.tolist(), self.latencies.T.tolist(), strict=True)
        for tenant, c, lat in rows:
            result.append(
                TenantDemand(
                    tenant,
                    in_flight=c[IN_FLIGHT],
                    queued=c[QUEUED],
                    admitted_total=c[ADMITTED],
                    completed_total=c[COMPLETED],
                    rejected_total=c[REJECTED],
                    limit_slots=c[LIMIT],
                    ttft=LatencySummary(c[TTFT_COUNT], lat[TTFT_P50], lat[TTFT_P90], lat[TTFT_P99]),
                    e2e=LatencySummary(c[E2E_COUNT], lat[E2E_P50], lat[E2E_P90], lat[E2E_P99]),
                    output_tokens_total=c[OUTPUT_TOKENS],
                    waste_tokens_total=c[WASTE_TOKENS],
                )
            )
        return result
