"""A short soak (the 10-minute one is `slotshift soak`): real processes under the mixed load;
the report has its schema, nothing stays in flight, the engine never exceeds its budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotshift.config import parse_config
from slotshift_tools.soak import EXPECTED_KINDS, run_soak

pytestmark = pytest.mark.e2e

BUDGET = 16
SERVICES = {"engine-sim", "controlplane", "gateway-0", "gateway-1", "agent"}


async def test_a_short_soak_ends_with_nothing_in_flight_and_the_budget_held(
    tmp_path: Path,
) -> None:
    config = parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": BUDGET,
                    "decision_period_s": 0.5,
                    "tenants": [
                        {"name": "A", "api_keys": ["soak-a"], "floor_slots": 2},
                        {"name": "B", "api_keys": ["soak-b"], "floor_slots": 2},
                    ],
                }
            ]
        }
    )
    summary = await run_soak(config, 12.0, tmp_path, sample_interval_s=1.0, grace_s=20.0)

    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["summary"] == json.loads(json.dumps(summary))
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    samples = report["samples"]
    assert len(samples) >= 10
    for sample in samples:
        assert set(sample) == {
            "t_s",
            "rss_mb",
            "in_flight",
            "queued",
            "engine_running",
            "engine_waiting",
            "max_in_engine",
            "outcomes",
        }
        assert set(sample["rss_mb"]) == SERVICES
        assert all(v is not None and v > 10 for v in sample["rss_mb"].values())
        assert sample["max_in_engine"] <= BUDGET
    assert max(s["max_in_engine"] for s in samples) > BUDGET // 2, "the load kept the engine busy"
    assert set(samples[len(samples) // 2]["in_flight"]) == {"gateway-0", "gateway-1"}

    assert summary["in_flight_drift"] == 0
    assert summary["final_in_flight"] == {
        "gateway-0": {"A": 0, "B": 0},
        "gateway-1": {"A": 0, "B": 0},
    }
    assert summary["admitted_total"] == summary["completed_total"]
    assert sum(summary["admitted_total"]["gateway-0"].values()) > 0
    assert summary["max_in_engine"] <= BUDGET
    assert set(summary["rss_growth"]) == SERVICES
    for growth in summary["rss_growth"].values():
        assert set(growth) == {
            "start_mb",
            "end_mb",
            "growth_mb",
            "growth_percent",
            "within_limit",
        }
    # Every deliberate fault was exercised, and nothing else went wrong.
    assert set(summary["outcomes_by_kind"]) == EXPECTED_KINDS, summary["outcomes_by_kind"]
    assert summary["unexpected_outcomes"] == {}
    assert summary["requests_completed"] > 100
    assert summary["criteria"] == {
        "in_flight_drift_zero": True,
        "admitted_equals_completed": True,
        "engine_within_budget": True,
        "no_unexpected_errors": True,
        "rss_growth_within_limit": True,
        "no_service_exited": True,
    }
    assert summary["passed"] is True
