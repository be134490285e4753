"""The soak's verdicts, from made-up samples: each criterion fails when its figure says so;
the config its stack runs on."""

from __future__ import annotations

from typing import Any

import pytest

from slotshift.config import parse_config
from slotshift_tools.local_stack import StackPorts
from slotshift_tools.soak import (
    RSS_GROWTH_LIMIT_MB,
    SOAK_QUEUE_DEPTH,
    Outcomes,
    SoakSample,
    rss_growth,
    soak_config,
    summarize,
)

SERVICES = ("engine-sim", "gateway-0")


def _sample(
    t_s: float, rss: float, *, in_flight: int = 0, queued: int = 0, gateway_rss: float = 70.0
) -> SoakSample:
    return SoakSample(
        t_s=t_s,
        rss_mb={"engine-sim": rss, "gateway-0": gateway_rss},
        in_flight={"gateway-0": {"A": in_flight, "B": 0}, "gateway-1": {"A": 0, "B": 0}},
        queued={"gateway-0": {"A": 0, "B": queued}, "gateway-1": {"A": 0, "B": 0}},
        engine_running=0,
        engine_waiting=0,
        max_in_engine=0,
        outcomes={},
    )


def _counters(admitted: int, completed: int) -> dict[str, dict[str, list[Any]]]:
    def gateway(a: int, c: int) -> dict[str, list[Any]]:
        return {
            "slotshift_gateway_requests_admitted_total": [({"tenant": "A"}, float(a))],
            "slotshift_gateway_requests_completed_total": [({"tenant": "A"}, float(c))],
        }

    return {"gateway-0": gateway(admitted, completed), "gateway-1": gateway(5, 5)}


def test_rss_growth_compares_the_medians_of_the_first_and_last_minute() -> None:
    # 10 minutes at 5 s: 60 MB for the first minute, a spike, 66 MB for the last minute.
    samples = [
        _sample(t, 60.0 if t <= 60 else (66.0 if t >= 540 else 90.0)) for t in range(0, 601, 5)
    ]
    samples[3].rss_mb["engine-sim"] = 200.0  # one outlier does not move a median
    growth = rss_growth(samples, "engine-sim")
    assert growth == {
        "start_mb": 60.0,
        "end_mb": 66.0,
        "growth_mb": 6.0,
        "growth_percent": 10.0,
        "within_limit": True,
    }


def test_rss_growth_over_both_limits_fails() -> None:
    start = 100.0
    end = start + RSS_GROWTH_LIMIT_MB + 1
    samples = [_sample(t, start if t < 300 else end) for t in range(0, 601, 5)]
    assert rss_growth(samples, "engine-sim")["within_limit"] is False


def test_rss_of_a_process_that_is_gone_is_no_growth_figure() -> None:
    samples = [_sample(t, 60.0) for t in range(0, 30, 5)]
    for sample in samples:
        sample.rss_mb["engine-sim"] = None
    assert rss_growth(samples, "engine-sim")["growth_mb"] is None


def _summary(
    samples: list[SoakSample],
    *,
    kinds: dict[str, int] | None = None,
    admitted: int = 10,
    completed: int = 10,
    engine_peak: int = 16,
    exited: tuple[str, ...] = (),
) -> dict[str, Any]:
    outcomes = Outcomes()
    for kind, count in (kinds or {"ok": 10, "http_429": 2}).items():
        for _ in range(count):
            outcomes.add(kind)
    return summarize(
        samples,
        samples,
        outcomes=outcomes,
        counters=_counters(admitted, completed),
        budget_slots=16,
        engine_peak=engine_peak,
        duration_s=60.0,
        exited=exited,
    )


def test_a_clean_soak_passes() -> None:
    summary = _summary([_sample(t, 60.0) for t in range(0, 61, 5)])
    assert summary["passed"] is True
    assert all(summary["criteria"].values())
    assert summary["requests_completed"] == 10
    assert summary["requests_sent"] == 12


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        ({"final_in_flight": 1}, "in_flight_drift_zero"),
        ({"final_queued": 2}, "in_flight_drift_zero"),
        ({"completed": 9}, "admitted_equals_completed"),
        ({"engine_peak": 17}, "engine_within_budget"),
        ({"kinds": {"ok": 3, "http_502": 1}}, "no_unexpected_errors"),
        ({"kinds": {"ok": 3, "TimeoutError": 1}}, "no_unexpected_errors"),
        ({"kinds": {"ok": 3, "stream_error_event": 1}}, "no_unexpected_errors"),
        ({"leak": True}, "rss_growth_within_limit"),
        ({"exited": ("gateway-1",)}, "no_service_exited"),
    ],
)
def test_each_criterion_fails_on_its_own(change: dict[str, Any], failed: str) -> None:
    samples = [_sample(t, 60.0) for t in range(0, 601, 5)]
    if change.get("leak"):
        samples = [_sample(t, 60.0 + t) for t in range(0, 601, 5)]
    samples.append(
        _sample(
            601.0,
            samples[-1].rss_mb["engine-sim"] or 0.0,
            in_flight=change.get("final_in_flight", 0),
            queued=change.get("final_queued", 0),
        )
    )
    summary = _summary(
        samples,
        kinds=change.get("kinds"),
        completed=change.get("completed", 10),
        engine_peak=change.get("engine_peak", 16),
        exited=change.get("exited", ()),
    )
    assert summary["passed"] is False
    assert [name for name, held in summary["criteria"].items() if not held] == [failed]


def test_the_soak_config_puts_the_stack_on_its_ports_with_a_small_queue() -> None:
    config = parse_config(
        {
            "pools": [{"name": "p", "budget_slots": 8, "tenants": [{"name": "A"}]}],
            "local_stack": {"engine": "vllm", "start_engine_sim": False},
        }
    )
    ports = StackPorts(8000, 50051, 9100, 9101, (8080, 8081))
    soaked = soak_config(config, ports)
    assert soaked.pools[0].engine_url == "http://127.0.0.1:8000"
    assert soaked.gateway.queue_max_depth == SOAK_QUEUE_DEPTH
    assert soaked.gateway.fallback_replicas == 2
    assert soaked.gateway.pool == soaked.agent.pool == "p"
    assert soaked.local_stack.gateway_ports == [8080, 8081]
    # Whatever `slotshift up` would start, the soak soaks the emulator.
    assert soaked.local_stack.engine == "emulator"
    assert soaked.local_stack.start_engine_sim is True
