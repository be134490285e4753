"""A request's figures, each recorded by one call that feeds every place it is read.

A latency the gateway measures is read in two places: the tenant's sliding window, whose
percentiles the control client reports to the control plane (`TenantState.ttft`, `.e2e`), and
the gateway's Prometheus histogram (`GatewayMetrics`). The handlers record each figure here, once;
nothing else writes either sink. The queue wait's window is the admission's own
(`TenantAdmission.queue_wait`, filled as it grants the slot), so only its histogram is fed here.
"""

from __future__ import annotations

from admission_gateway.admission import Slot
from admission_gateway.gateway_state import TenantState
from admission_gateway.metrics import GatewayMetrics
from slotshift.clock import Clock


class RequestFigures:
    """Records a request's latencies, measured from its arrival on `clock`'s monotonic time."""

    def __init__(self, metrics: GatewayMetrics, clock: Clock) -> None:
        self._metrics = metrics
        self._clock = clock

    def admitted(self, tenant: TenantState, slot: Slot) -> None:
        """A new request of `tenant` got `slot`: its queue wait, into the histogram (the
        admission's window has it already)."""
        self._metrics.observe_queue_wait(tenant.name, slot.queue_wait_s)

    def first_token(self, tenant: TenantState, arrived: float) -> None:
        """A streamed request of `tenant` that arrived at `arrived` sent its first generated
        content now: its time to first token, into the window and the histogram."""
        elapsed = self._clock.monotonic() - arrived
        tenant.ttft.observe(elapsed)
        self._metrics.observe_time_to_first_token(tenant.name, elapsed)

    def completed(self, tenant: TenantState, arrived: float) -> None:
        """A request of `tenant` that arrived at `arrived` got the last byte of a successful
        answer now: its end-to-end latency, into the window and the histogram."""
        elapsed = self._clock.monotonic() - arrived
        tenant.e2e.observe(elapsed)
        self._metrics.observe_e2e_latency(tenant.name, elapsed)
