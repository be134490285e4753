"""The load generator against two fake gateways: concurrency held, bursts on time, round robin,
open-loop arrivals as drawn, cancellation at the horizon."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from slotshift.clock import SystemClock
from slotshift_tools.bench.arrivals import arrival_times, on_at, tenant_rng
from slotshift_tools.bench.client import StreamingClient
from slotshift_tools.bench.load import LoadGenerator
from slotshift_tools.bench.scenario import OnOffArrival, Scenario, parse_scenario
from slotshift_tools.bench.trace import RequestStatus
from tests.unit.slotshift_tools.bench.fake_gateway import running_fake_gateway

# Long enough that A's second burst survives a stall of a few hundred ms on a loaded machine
# (a 1 s horizon with a 0.3 s burst failed once in CI).
HORIZON_S = 2.0


def _scenario() -> Scenario:
    def tenant(name: str, key: str, arrival: dict[str, object]) -> dict[str, object]:
        return {
            "name": name,
            "api_keys": [key],
            "floor_slots": 0,
            "arrival": arrival,
            "prompt_tokens": 4,
            "output_tokens": 3,
            "slo": {"e2el_ms": 1000},
        }

    return parse_scenario(
        {
            "name": "load",
            "seed": 5,
            "budget_slots": 8,
            "warmup_s": 0.0,
            "steady_s": HORIZON_S,
            "failure_backoff_s": 0.2,
            "policies": ["static"],
            "tenants": [
                tenant(
                    "A",
                    "key-a",
                    {
                        "kind": "on_off",
                        "on_s": 0.6,
                        "off_s": 0.6,
                        "first_on_s": 0.2,
                        "concurrency": 3,
                    },
                ),
                tenant("B", "key-b", {"kind": "closed_loop", "outstanding": 2}),
                tenant("C", "key-c", {"kind": "poisson", "rate_per_s": 40}),
                tenant("R", "refuse", {"kind": "closed_loop", "outstanding": 1}),
            ],
        }
    )


async def test_the_load_follows_each_tenants_process() -> None:
    scenario = _scenario()
    clock = SystemClock()
    async with (
        running_fake_gateway() as first,
        running_fake_gateway() as second,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        client = StreamingClient(
            session, model="m", clock=clock, origin_s=clock.monotonic(), timeout_s=5.0
        )
        load = LoadGenerator(scenario, client, [first.url, second.url], horizon_s=HORIZON_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HORIZON_S):
                await load.run()

    by_tenant = {name: [t for t in load.traces if t.tenant == name] for name in "ABCR"}
    peak = first.peak_running + second.peak_running
    # Closed loops keep their number outstanding, spread over both gateways.
    assert peak["key-b"] == 2
    assert first.peak_running["key-b"] == second.peak_running["key-b"] == 1
    assert 1 <= first.peak_running["key-a"] <= 2 and 1 <= second.peak_running["key-a"] <= 2
    assert len(by_tenant["B"]) > 10
    # A sends only in its bursts (0.2-0.8 s and 1.4-2.0 s).
    arrival = scenario.tenant("A").arrival
    assert isinstance(arrival, OnOffArrival)
    assert by_tenant["A"]
    assert all(
        on_at(arrival, t.start_s - 0.02) or on_at(arrival, t.start_s) for t in by_tenant["A"]
    )
    assert any(t.start_s > 1.39 for t in by_tenant["A"])
    # C sends at its drawn times, whatever the answers.
    drawn = arrival_times(scenario.tenant("C").arrival, tenant_rng(5, "C", "arrivals"), HORIZON_S)
    assert len(drawn) - 1 <= len(by_tenant["C"]) <= len(drawn)
    for trace, at_s in zip(by_tenant["C"], drawn, strict=False):
        assert trace.start_s >= at_s
    # A refused closed-loop client backs off instead of hammering the gateway.
    # At most one try per backoff (0.2 s) over the horizon, plus the first.
    assert 2 <= len(by_tenant["R"]) <= 11
    assert all(t.status is RequestStatus.FAILED and t.http_status == 429 for t in by_tenant["R"])
    # What was still running at the horizon is cancelled (B's two, unless the horizon fell
    # between an answer and its refill); everything else completed.
    statuses = {t.status for t in by_tenant["B"]}
    assert RequestStatus.OK in statuses
    assert statuses <= {RequestStatus.OK, RequestStatus.CANCELLED}
    assert sum(t.status is RequestStatus.CANCELLED for t in by_tenant["B"]) <= 2
    for name, counters in load.counters.items():
        assert counters.outstanding == 0
        assert counters.sent == len(by_tenant[name])
        assert counters.completed == sum(t.status is RequestStatus.OK for t in by_tenant[name])
    assert {len(t.itl_s) for t in load.traces if t.status is RequestStatus.OK} == {2}


async def test_the_same_seed_sends_the_same_requests() -> None:
    scenario = _scenario()
    payloads = []
    for _ in range(2):
        clock = SystemClock()
        async with (
            running_fake_gateway() as gateway,
            aiohttp.ClientSession() as session,
        ):
            client = StreamingClient(
                session, model="m", clock=clock, origin_s=clock.monotonic(), timeout_s=5.0
            )
            only_b = scenario.model_copy(update={"tenants": [scenario.tenant("B")]})
            load = LoadGenerator(only_b, client, [gateway.url], horizon_s=0.2)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await load.run()
            # The two clients' first requests leave together; their arrival order may differ.
            payloads.append(sorted(r["prompt"] for r in gateway.requests[:2]))
    assert payloads[0] == payloads[1]
    assert len(payloads[0]) == 2
