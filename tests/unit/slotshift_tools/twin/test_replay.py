"""`slotshift simulate --replay`: a request log written by the gateways' own writer, replayed in
the twin under two policies: the same results every time, every request sent at its recorded
instant with its recorded shape, a log tenant the scenario lacks refused by name."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from slotshift.request_log import Outcome, RequestLogWriter, RequestRecord
from slotshift_tools.bench.scenario import Scenario, load_scenario
from slotshift_tools.bench.trace import RequestStatus
from slotshift_tools.twin.command import run_simulate, simulate_scenario
from slotshift_tools.twin.replay import ReplayError, replayed_traffic

SEED = Path(__file__).resolve().parents[4] / "bench" / "scenarios" / "seed.yaml"
T0 = 1_760_000_000.0
"""The log's first arrival (wall clock)."""

B_SENDS = 360
"""B's requests, 30 a second for 12 s, each answer 512 tokens long: about three times its
static share of 48 in flight, so that lending A's idle slots (demand) shows."""


def _record(offset_s: float, tenant: str, gateway: str, **fields: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "arrival_unix_s": T0 + offset_s,
        "gateway": gateway,
        "pool": "default",
        "tenant": tenant,
        "route": "/v1/completions",
        "streamed": True,
        "max_tokens": 64,
        "prompt_tokens": 64,
        "output_tokens": 64,
        "output_tokens_from": "usage",
        "outcome": Outcome.COMPLETED,
        "status": 200,
        "e2e_ms": 900.0,
    }
    return RequestRecord(**(base | fields))


def _records(*, stranger: bool = False) -> list[RequestRecord]:
    """A's requests every 0.5 s for 12 s, B's all along (some answers not streamed, one request
    cut short by its client), in the order two gateways saw them end."""
    records = [
        _record(0.5 * i, "A", f"gw-{i % 2}", prompt_tokens=40 + i, output_tokens=16 + i)
        for i in range(24)
    ]
    records += [
        _record(
            i / 30.0,
            "B",
            f"gw-{i % 2}",
            prompt_tokens=200,
            output_tokens=512,
            max_tokens=512,
            streamed=i % 3 != 0,
            e2e_ms=6000.0,
        )
        for i in range(B_SENDS)
    ]
    records.append(
        _record(
            1.0,
            "B",
            "gw-0",
            outcome=Outcome.CANCELLED,
            reason="client_disconnected",
            output_tokens=5,
            max_tokens=120,
            e2e_ms=200.0,
        )
    )
    if stranger:
        records.append(_record(0.6, "Z", "gw-1"))
    return sorted(records, key=lambda r: r.ended_unix_s)


def _write_logs(folder: Path, records: list[RequestRecord]) -> list[Path]:
    """Each gateway's records through the production writer, one file per gateway (on a loop
    of its own: the twin runs its own virtual loop, so the tests are not coroutines)."""
    return asyncio.run(_write(folder, records))


async def _write(folder: Path, records: list[RequestRecord]) -> list[Path]:
    paths = []
    for gateway in ("gw-0", "gw-1"):
        path = folder / f"requests-{gateway}.jsonl"
        writer = RequestLogWriter(
            path,
            max_bytes_per_file=1 << 20,
            files_kept=2,
            flush_interval_s=1.0,
            max_buffered_records=1000,
        )
        await writer.open()
        for record in records:
            if record.gateway == gateway:
                writer.write(record)
        await writer.close()
        assert writer.dropped_total == 0
        paths.append(path)
    return paths


def _scenario(*runs: str) -> Scenario:
    scenario = load_scenario(SEED)
    return scenario.model_copy(update={"policies": [scenario.run(name) for name in runs]})


def test_a_replay_is_deterministic_and_sends_at_the_recorded_instants(
    tmp_path: Path,
) -> None:
    paths = _write_logs(tmp_path, _records())
    scenario = _scenario("static", "demand")
    traffic = replayed_traffic(paths, scenario)
    # From the first arrival to the last end (B's last request, sent at 11.97 s,
    # lasted 6 s).
    assert traffic.span_s == pytest.approx((B_SENDS - 1) / 30.0 + 6.0)
    assert traffic.silent_tenants == ()

    def run() -> dict[str, Any]:
        return simulate_scenario(
            scenario, steady_s=traffic.span_s - 0.2, warmup_s=0.2, schedule=traffic.sends
        )

    first, second = run(), run()
    for name in ("static", "demand"):
        assert [t.to_json() for t in first[name].result.traces] == [
            t.to_json() for t in second[name].result.traces
        ]
        assert first[name].record.summary == second[name].record.summary
    # The policy mattered: demand lends A's idle slots to B, static does not.
    static_b = first["static"].record.summary["tenants"]["B"]
    demand_b = first["demand"].record.summary["tenants"]["B"]
    assert demand_b["completed"] > static_b["completed"]

    recorded = {
        name: [(r.send_at_s, r.prompt_tokens, r.output_tokens, r.streamed) for r in sends]
        for name, sends in traffic.sends.items()
    }
    assert len(recorded["B"]) == B_SENDS + 1
    # The cancelled request is replayed whole, at the length its client asked for.
    assert (1.0, 64, 120, True) in recorded["B"]
    for name in ("static", "demand"):
        traces = first[name].result.traces
        for tenant, sends in recorded.items():
            sent = [t for t in traces if t.tenant == tenant]
            assert len(sent) == len(sends)
            for trace, (send_at_s, prompt, output, streamed) in zip(sent, sends, strict=True):
                assert trace.start_s == pytest.approx(send_at_s, abs=1e-9)
                assert (trace.prompt_tokens, trace.max_tokens) == (prompt, output)
                if trace.status is RequestStatus.OK:
                    # A whole answer has no first token at the client; a stream has one.
                    assert (trace.first_token_s is not None) == streamed
                    assert trace.output_tokens == output
        assert any(t.status is RequestStatus.OK and t.first_token_s is None for t in traces)


def test_the_command_says_which_tenants_send_nothing(tmp_path: Path) -> None:
    paths = _write_logs(tmp_path, [r for r in _records() if r.tenant == "B"])
    scenario_path = tmp_path / "seed.yaml"
    scenario_path.write_text(SEED.read_text(encoding="utf-8"), encoding="utf-8")
    out = io.StringIO()
    status = run_simulate(
        scenario_path,
        out_dir=tmp_path / "results",
        runs=["static"],
        replay=paths,
        out=out,
    )
    assert status == 0
    assert "not in the log, so sending nothing: A" in out.getvalue()
    document = json.loads((tmp_path / "results" / "summary.json").read_text())
    replay = document["meta"]["replay"]
    assert replay["silent_tenants"] == ["A"]
    assert replay["requests"] == {"B": B_SENDS + 1}
    assert "--replay" in document["meta"]["command"]
    tenants = document["policies"]["static"]["tenants"]
    assert tenants["A"]["completed"] == 0
    assert tenants["B"]["completed"] > 0


def test_a_tenant_the_scenario_lacks_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _write_logs(tmp_path, _records(stranger=True))
    with pytest.raises(ReplayError, match="tenants Z are not in scenario seed"):
        replayed_traffic(paths, _scenario("static"))
    status = run_simulate(SEED, out_dir=tmp_path / "results", replay=paths, out=io.StringIO())
    assert status == 2
    assert "Z" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_a_replay_takes_no_duration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _write_logs(tmp_path, _records())
    status = run_simulate(SEED, duration_s=5.0, replay=paths, out=io.StringIO())
    assert status == 2
    assert "log's span" in capsys.readouterr().err
