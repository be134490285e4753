"""summary.json's document and the markdown table, from synthetic runs."""

from __future__ import annotations

from typing import Any

import pytest

from slotshift_tools.bench.scenario import Goal, Scenario, parse_scenario
from slotshift_tools.bench.stats import RESULT_FIELDS
from slotshift_tools.bench.summary import (
    RECLAIM_FIELDS,
    STUDY_TENANT_FIELDS,
    STUDY_TOTAL_FIELDS,
    markdown_table,
    ratio_pairs,
    run_summary,
    summary_document,
)
from slotshift_tools.bench.waste import WASTE_FIELDS
from tests.unit.slotshift_tools.bench.runs import run_result, sample
from tests.unit.slotshift_tools.bench.traces import done


def _scenario() -> Scenario:
    return parse_scenario(
        {
            "name": "mini",
            "seed": 1,
            "budget_slots": 8,
            "warmup_s": 2.0,
            "steady_s": 8.0,
            "policies": ["static", "demand", "pool"],
            "tenants": [
                {
                    "name": name,
                    "api_keys": [f"key-{name}"],
                    "arrival": {"kind": "closed_loop", "outstanding": 2},
                    "prompt_tokens": 4,
                    "output_tokens": 4,
                    "slo": {"e2el_ms": 1000},
                }
                for name in ("A", "B")
            ],
            "goals": [
                {"ratio": "demand/static", "field": "output_throughput", "at_least": 1.5},
                {"ratio": "demand/static", "field": "completed", "tenant": "B", "at_least": 1.0},
                {"ratio": "demand/pool", "field": "p99_e2el_ms", "at_most": 1.0},
            ],
        }
    )


SCENARIO = _scenario()


def test_a_runs_summary_has_every_field_for_the_total_and_each_tenant() -> None:
    summary = run_summary(SCENARIO, run_result(SCENARIO, "demand"))
    assert set(summary["total"]) == (
        set(RESULT_FIELDS) | set(STUDY_TOTAL_FIELDS) | set(WASTE_FIELDS)
    )
    for tenant in ("A", "B"):
        assert set(summary["tenants"][tenant]) == (
            set(RESULT_FIELDS) | set(STUDY_TENANT_FIELDS) | set(RECLAIM_FIELDS) | set(WASTE_FIELDS)
        )
    assert summary["total"]["completed"] == 3
    assert summary["tenants"]["A"]["completed"] == 2
    assert summary["tenants"]["B"]["total_output_tokens"] == 8


def test_the_studys_figures_come_from_samples_and_decisions() -> None:
    samples = [sample(t / 2, {"A": 4, "B": 4}, gpu=50.0) for t in range(4)]  # 0 .. 1.5 s
    samples += [sample(2.0 + t, {"A": 2, "B": 6}, gpu=60.0 + 10 * t) for t in range(4)]
    samples.append(sample(10.5, {"A": 8, "B": 0}, gpu=100.0))  # after the window
    summary = run_summary(SCENARIO, run_result(SCENARIO, "demand", samples=samples))
    total, a, b = summary["total"], summary["tenants"]["A"], summary["tenants"]["B"]
    assert total["mean_gpu_utilization_pct"] == pytest.approx(75.0)
    assert total["peak_gpu_utilization_pct"] == 90.0
    assert total["gpu_utilization_emulated"] is True
    assert total["engine_output_throughput"] == pytest.approx(1000.0)
    assert (total["decisions"], total["moves"], total["holds"]) == (2, 1, 1)
    assert (a["moves_toward"], b["moves_toward"]) == (0, 1)
    assert (a["final_cap_slots"], b["final_cap_slots"]) == (2, 6)
    assert a["mean_limit_slots"] == 2.0
    assert summary["controller"]["final_caps"] == {"A": 2, "B": 6}


def test_the_pool_baseline_has_no_caps_per_tenant() -> None:
    summary = run_summary(SCENARIO, run_result(SCENARIO, "pool", decisions=[]))
    assert summary["tenants"]["A"]["final_cap_slots"] is None
    assert summary["tenants"]["A"]["mean_limit_slots"] is None
    assert summary["tenants"]["A"]["moves_toward"] == 0
    assert summary["controller"]["final_caps"] == {"pool": 8}


def _waste_samples() -> list[Any]:
    """Samples at 2 s and 10 s (the window's ends) whose counters show waste: the engine
    generated 40 tokens and computed 60 prompt tokens; B's gateways counted 5 + 3 of them."""
    first, last = sample(2.0, {"A": 4, "B": 4}), sample(10.0, {"A": 4, "B": 4})
    first.engine_generation_tokens, last.engine_generation_tokens = 100.0, 140.0
    first.engine_prefix_cache_queries, last.engine_prefix_cache_queries = 500.0, 600.0
    first.engine_prefix_cache_hits, last.engine_prefix_cache_hits = 100.0, 140.0
    first.gateway_waste_tokens = {"B": {"discarded_output": 1.0}}
    last.gateway_waste_tokens = {"B": {"discarded_output": 6.0, "recomputed_prompt": 3.0}}
    return [sample(1.0, {"A": 4, "B": 4}), first, last]


def test_the_waste_comes_from_the_engines_and_the_gateways_counters() -> None:
    summary = run_summary(SCENARIO, run_result(SCENARIO, "demand", samples=_waste_samples()))
    total, a, b = summary["total"], summary["tenants"]["A"], summary["tenants"]["B"]
    # The default traces deliver 4 + 4 + 8 = 16 tokens and prefill 3 x 10 prompt tokens.
    assert total["waste_discarded_output_tokens"] == 40 - 16
    assert total["waste_recomputed_prompt_tokens"] == 60 - 30
    assert total["waste_tokens"] == 54
    assert total["waste_percent"] == pytest.approx(100.0 * 54 / 16)
    assert (b["waste_tokens"], b["waste_percent"]) == (8.0, 100.0)
    assert (a["waste_tokens"], a["waste_percent"]) == (0.0, 0.0)


def test_without_counters_the_waste_is_null() -> None:
    summary = run_summary(SCENARIO, run_result(SCENARIO, "demand"))
    assert summary["total"]["waste_tokens"] is None
    assert summary["total"]["waste_percent"] is None
    assert summary["tenants"]["B"]["waste_tokens"] is None


def test_the_pool_baseline_has_no_waste_per_tenant() -> None:
    summary = run_summary(SCENARIO, run_result(SCENARIO, "pool", samples=_waste_samples()))
    assert summary["total"]["waste_tokens"] == 54
    assert summary["tenants"]["B"]["waste_tokens"] is None


def test_a_goal_bounds_one_runs_waste() -> None:
    goal = Goal(run="demand", field="waste_percent", at_most=3.0)
    scenario = SCENARIO.model_copy(update={"goals": [goal]})
    policies = {
        "demand": run_summary(scenario, run_result(scenario, "demand", samples=_waste_samples()))
    }
    document = summary_document(scenario, policies, {})
    (goal,) = document["goals"]
    assert goal["value"] == pytest.approx(100.0 * 54 / 16)
    assert goal["met"] is False
    table = markdown_table(document)
    assert "| waste (tokens) | 54 |" in table
    assert "| waste (% of output) | 337.50 |" in table
    assert "| waste B (% of its output) | 100.00 |" in table


def test_ratio_pairs_compare_each_policy_with_earlier_ones_and_the_baselines() -> None:
    pairs = ratio_pairs(["static", "demand", "pool"], ["pool"])
    assert pairs == [("static", "pool"), ("demand", "static"), ("demand", "pool")]


def _document() -> dict[str, Any]:
    faster = [
        done("A", 3.0, 0.1, [0.01] * 3),
        done("A", 4.0, 0.2, [0.01] * 3),
        done("B", 3.0, 0.5, [0.02] * 7),
        done("B", 5.0, 0.5, [0.02] * 7),
    ]
    policies = {
        "static": run_summary(SCENARIO, run_result(SCENARIO, "static")),
        "demand": run_summary(SCENARIO, run_result(SCENARIO, "demand", traces=faster)),
        "pool": run_summary(SCENARIO, run_result(SCENARIO, "pool")),
    }
    return summary_document(SCENARIO, policies, {"scenario": "mini"})


def test_the_document_has_meta_ratios_and_goals() -> None:
    document = _document()
    assert document["meta"]["scenario"] == "mini"
    assert "windowing" in document["meta"]["definitions"]
    assert set(document["ratios"]) == {"static/pool", "demand/static", "demand/pool"}
    demand_static = document["ratios"]["demand/static"]
    assert demand_static["output_throughput"] == pytest.approx(24 / 16)
    assert demand_static["completed"] == pytest.approx(4 / 3)
    assert demand_static["tenants"]["B"]["output_throughput"] == pytest.approx(2.0)
    assert demand_static["tenants"]["A"]["output_throughput"] == pytest.approx(1.0)
    goals = {(g["ratio"], g["field"]): g for g in document["goals"]}
    assert goals["demand/static", "output_throughput"]["met"] is True
    assert goals["demand/static", "completed"]["value"] == pytest.approx(2.0)
    assert goals["demand/static", "completed"]["met"] is True
    # demand's p99 is its slowest request; pool's interpolates below it, with fewer requests.
    assert goals["demand/pool", "p99_e2el_ms"]["value"] > 1.0
    assert goals["demand/pool", "p99_e2el_ms"]["met"] is False


def test_the_markdown_table_has_a_column_per_run_and_ratio() -> None:
    table = markdown_table(_document())
    header = table.splitlines()[0]
    assert (
        header == "| figure | static | demand | pool | static/pool | demand/static | demand/pool |"
    )
    throughput = next(
        line for line in table.splitlines() if line.startswith("| output throughput (tok/s)")
    )
    assert throughput.split("|")[2].strip() == "2"  # 16 tokens in 8 s
    assert "| 1.500 |" in throughput
    assert "| final cap B (slots) | 4 | 4 | - |" in table
    assert "| demand/static output_throughput (total) | 1.500 | >= 1.5 | yes |" in table


def test_a_run_whose_harness_fell_behind_is_flagged() -> None:
    result = run_result(SCENARIO, "demand")
    result.harness = {"loop_lag_p99_ms": 750.0, "loop_lag_max_ms": 3600.0}
    summary = run_summary(SCENARIO, result)
    assert "fell behind" in summary["harness"]["disturbed"]
    document = summary_document(SCENARIO, {"demand": summary}, {})
    assert "WARNING: run demand: the harness's event loop lagged (p99 750 ms" in markdown_table(
        document
    )
    calm = run_summary(SCENARIO, run_result(SCENARIO, "static"))
    assert calm["harness"]["disturbed"] is None


def test_the_table_shows_each_runs_harness_lag_beside_its_latencies() -> None:
    calm, lagging = run_result(SCENARIO, "static"), run_result(SCENARIO, "demand")
    calm.harness = {"loop_lag_p99_ms": 3.1}
    lagging.harness = {"loop_lag_p99_ms": 42.4}
    runs = {"static": run_summary(SCENARIO, calm), "demand": run_summary(SCENARIO, lagging)}
    table = markdown_table(summary_document(SCENARIO, runs, {}))
    [row] = [line for line in table.splitlines() if line.startswith("| harness loop lag")]
    assert row.split("|")[2:4] == [" 3 ", " 42 "]


def _bursty_scenario() -> Scenario:
    data = SCENARIO.model_dump(mode="json")
    data["tenants"][0]["api_keys"] = ["key-A"]
    data["tenants"][1]["api_keys"] = ["key-B"]
    data["tenants"][0]["arrival"] = {"kind": "on_off", "on_s": 2.0, "off_s": 2.0, "rate_per_s": 5}
    data["goals"] = [{"run": "demand", "field": "reclaim_median_s", "tenant": "A", "at_most": 0.4}]
    return parse_scenario(data)


def test_reclaim_is_timed_at_each_burst_of_an_on_off_tenant() -> None:
    scenario = _bursty_scenario()
    # Bursts start at 0, 4 and 8 s; the window is [2, 10]: the bursts at 4 and 8 s count.
    samples = [sample(t / 4, {"A": 4, "B": 4}) for t in range(41)]
    for s in samples:
        if 4.0 <= s.t_s < 4.5 or 8.0 <= s.t_s < 8.75:
            s.queued["A"] = 3  # A waits for its slots: 0.5 s, then 0.75 s
    summary = run_summary(scenario, run_result(scenario, "demand", samples=samples))
    a, b = summary["tenants"]["A"], summary["tenants"]["B"]
    assert (a["reclaim_bursts"], a["reclaim_short_bursts"], a["reclaim_unresolved"]) == (2, 2, 0)
    assert a["reclaim_median_s"] == pytest.approx(0.625)
    assert a["reclaim_p90_s"] == pytest.approx(0.725)
    assert b["reclaim_median_s"] is None  # a closed loop has no bursts
    pool = run_summary(scenario, run_result(scenario, "pool", decisions=[]))
    assert pool["tenants"]["A"]["reclaim_median_s"] is None  # no tenant limits to reclaim

    document = summary_document(scenario, {"demand": summary}, {})
    (goal,) = document["goals"]
    assert (goal["run"], goal["value"], goal["met"]) == ("demand", pytest.approx(0.625), False)
    table = markdown_table(document)
    assert "| reclaim median A (s) | 0.62 |" in table
    assert "| demand reclaim_median_s (tenant A) | 0.625 | <= 0.4 | NO |" in table
