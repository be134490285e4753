"""End to end: `slotshift bench-gateway --quick` against real gateway, control plane, upstream
and (when installed) HAProxy processes: every figure is in the JSON, and each is sane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from slotshift_tools.gateway_bench.haproxy import find_haproxy
from slotshift_tools.gateway_bench.report import FIGURES
from tests.e2e.service_processes import run_in_checkout

pytestmark = pytest.mark.e2e

PAIRS = 40
INTERFERENCE_PAIRS = 20


def test_a_quick_run_measures_every_figure_of_every_peer(tmp_path: Path) -> None:
    out = tmp_path / "gateway"
    result = run_in_checkout(
        "-m",
        "slotshift_tools",
        "bench-gateway",
        "--quick",
        "--pairs",
        str(PAIRS),
        "--interference-pairs",
        str(INTERFERENCE_PAIRS),
        "--out",
        str(out),
        timeout_s=180,
    )
    document = json.loads((out / "gateway.json").read_text())
    haproxy = find_haproxy() is not None
    assert document["peers"]["haproxy"]["available"] is haproxy
    if not haproxy:
        assert "haproxy is not installed" in result.stdout
    proxies = ["gateway", "tcp-relay", "aiohttp-relay", "protocol-relay"]
    proxies += ["haproxy"] if haproxy else []
    assert list(document["figures"]) == proxies

    gateway = document["figures"]["gateway"]
    assert set(gateway) == set(FIGURES)
    assert all(value is not None for value in gateway.values()), gateway
    assert gateway["cpu_ms_per_1000_events_plain"] > 0
    assert gateway["cpu_ms_per_1000_events_preemptible"] > 0
    # A proxy adds a hop: on a median of paired requests it cannot be faster than direct.
    assert gateway["non_streamed_added_p50_ms"] >= 0
    assert gateway["ttft_added_p50_ms"] >= 0
    # The floor relays the same events with no HTTP: it costs something, and less than the gateway.
    floor = document["figures"]["tcp-relay"]["cpu_ms_per_1000_events_plain"]
    assert 0 < floor < gateway["cpu_ms_per_1000_events_plain"]
    # The aiohttp relay relays them through aiohttp's parsers: more than the bare relay's.
    assert document["figures"]["aiohttp-relay"]["cpu_ms_per_1000_events_plain"] > floor
    assert document["figures"]["protocol-relay"]["cpu_ms_per_1000_events_plain"] > 0
    if haproxy:
        # CPU is read in 10 ms ticks: HAProxy's few ms of a quick window may read as none.
        assert document["figures"]["haproxy"]["cpu_ms_per_1000_events_plain"] >= 0

    [run] = document["runs"]
    for kind in ("non_streamed", "ttft", "non_streamed_after_idle"):
        for target in ["direct", *proxies]:
            assert run["latency"][kind][target]["requests"] >= PAIRS
    for proxy in proxies:
        assert run["interference"][proxy]["requests"] >= INTERFERENCE_PAIRS
        window = run["interference"][proxy]["batch_window"]
        assert window["events"] > 0
    plain = run["cpu"]["gateway"]["plain"]
    assert plain["events"] > 0 and plain["stream_requests"] > 0
    assert run["cpu"]["direct"]["plain"]["cores"]["upstream"] > 0
    assert plain["harness_cores"] > 0

    mix = run["accounting"]
    assert {name: window["count_tokens"] for name, window in mix.items()} == {
        "gateway-mix-counted": True,
        "gateway-mix-uncounted": False,
    }
    for window in mix.values():
        assert window["events"] > 0 and window["requests"] > 0
        assert window["cut_by_client"] > 0, "the mix has cancelled streams"
        assert window["bursts"] >= 1, "the lender took its share back at least once"
    assert gateway["cpu_ms_per_1000_events_mix_counted"] > 0

    assert "CPU per 1,000 relayed events" in (out / "summary.md").read_text()
    assert imread(out / "gateway.png").shape[0] > 100


def test_the_request_cpu_script_reads_every_proxys_cost_per_request(tmp_path: Path) -> None:
    # scripts/gateway_request_cpu.py, the per-request counterpart of the CPU windows.
    out = tmp_path / "request-cpu.json"
    run_in_checkout(
        "scripts/gateway_request_cpu.py", "--requests", "100", "--out", str(out), timeout_s=180
    )
    figures = json.loads(out.read_text())["figures"]
    expected = ["gateway", "aiohttp-relay", "tcp-relay", "protocol-relay"]
    assert list(figures) == expected + (["haproxy"] if find_haproxy() is not None else [])
    assert all(f["wall_ms_per_request"] > 0 for f in figures.values()), figures
    # CPU is read in 10 ms ticks; over 100 requests the gateway's is well over one.
    assert figures["gateway"]["cpu_us_per_request"] > figures["tcp-relay"]["cpu_us_per_request"]
