"""RequestFigures: one call per figure feeds both the reported window and the histogram."""

from __future__ import annotations

import pytest

from admission_gateway.figures import RequestFigures
from admission_gateway.gateway_state import GatewayState
from admission_gateway.metrics import GatewayMetrics
from slotshift.clock import ManualClock
from slotshift.config import GatewayConfig, PoolConfig

POOL = PoolConfig.model_validate(
    {"name": "p", "budget_slots": 4, "tenants": [{"name": "A"}, {"name": "B"}]}
)


def _histogram(metrics: GatewayMetrics, name: str, tenant: str) -> tuple[float, float]:
    """(count, sum) of a gateway histogram's series for `tenant`."""
    labels = {"pool": "p", "tenant": tenant}
    count = metrics.registry.get_sample_value(f"{name}_count", labels)
    total = metrics.registry.get_sample_value(f"{name}_sum", labels)
    return (count or 0.0, total or 0.0)


@pytest.mark.parametrize(
    ("record", "window", "histogram"),
    [
        pytest.param(
            "first_token", "ttft", "slotshift_gateway_time_to_first_token_seconds", id="ttft"
        ),
        pytest.param("completed", "e2e", "slotshift_gateway_e2e_request_latency_seconds", id="e2e"),
    ],
)
def test_a_latency_goes_to_the_window_and_the_histogram_at_once(
    record: str, window: str, histogram: str
) -> None:
    clock = ManualClock()
    state = GatewayState(POOL, GatewayConfig(), clock)
    metrics = GatewayMetrics(state)
    figures = RequestFigures(metrics, clock)
    observed = figures.begin(
        state.tenants["A"], clock.monotonic(), route="/v1/completions", headers={}
    )
    clock.advance(0.25)

    getattr(observed, record)()

    percentiles = getattr(state.tenants["A"], window).percentiles()
    assert (percentiles.count, percentiles.p50_ms) == (1, 250.0)
    assert _histogram(metrics, histogram, "A") == (1.0, 0.25)
    assert getattr(state.tenants["B"], window).percentiles().count == 0
    assert _histogram(metrics, histogram, "B") == (0.0, 0.0)
