"""Integration, real servers on port 0 in one process, each service with a tracer provider of its
own (as in separate processes): the traces a decision and a request leave, and how they connect.

- a decision is a root span, linked to the telemetry report it used; the pushes of its allocation
  are its children, and each gateway's "allocation.apply" is the child of its push;
- a request's server span at the gateway has its queue wait and its upstream call as children,
  and the emulator's "llm_request" continues the trace from the upstream call;
- a request admitted under a decision's allocation links to that decision;
- a gateway's connection shows as its connect span and the control plane's, parent and child.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from admission_gateway.gateway import AdmissionGateway
from controlplane.server import ControlPlane
from engine_sim.server import EngineSim
from slotshift.config import SlotshiftConfig, parse_config
from telemetry_agent.agent import TelemetryAgent
from tests.integration.stack import NoGpu
from tests.stream_tokens import StreamTokens
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY_B = "key-b"
MODEL = "Qwen/Qwen2.5-3B-Instruct"
TOKENS = 200


class Traced:
    """One service's tracer provider, keeping its finished spans in memory."""

    def __init__(self, service: str) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=Resource({"service.name": service}), shutdown_on_exit=False
        )
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]


@dataclass
class Stack:
    engine: EngineSim
    control_plane: ControlPlane
    gateways: list[AdmissionGateway]
    traced: dict[str, Traced]


def _config(engine_url: str, grpc_port: int) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 8,
                    "policy": "demand",
                    "decision_period_s": 0.2,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": ["key-a"], "floor_slots": 1},
                        {"name": "B", "api_keys": [KEY_B], "floor_slots": 1},
                    ],
                }
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "fallback_replicas": 2,
                "report_interval_s": 0.05,
            },
            "agent": {
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "engine_metrics_url": f"{engine_url}/metrics",
                "metrics_port": 0,
                "interval_s": 0.1,
            },
            "engine_sim": {"port": 0},
        }
    )


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    traced = {
        name: Traced(name)
        for name in ("controlplane", "gateway-0", "gateway-1", "agent", "engine-sim")
    }
    async with AsyncExitStack() as exits:
        tokens = StreamTokens.for_stack(exits)
        base = tokens.apply(_config("http://127.0.0.1:1", 0))
        engine = EngineSim(base.engine_sim, tracer_provider=traced["engine-sim"].provider)
        await engine.start()
        exits.push_async_callback(engine.stop)
        control_plane = ControlPlane(base, tracer_provider=traced["controlplane"].provider)
        await control_plane.start()
        exits.push_async_callback(control_plane.stop)
        config = tokens.apply(_config(engine.url, control_plane.grpc_port))
        agent = TelemetryAgent(
            config.agent, gpu_reader=NoGpu(), tracer_provider=traced["agent"].provider
        )
        await agent.start()
        exits.push_async_callback(agent.stop)
        gateways = []
        for index in range(2):
            gateway = AdmissionGateway(
                config,
                gateway_id=f"gw-{index}",
                tracer_provider=traced[f"gateway-{index}"].provider,
            )
            await gateway.start()
            exits.push_async_callback(gateway.stop)
            gateways.append(gateway)
        yield Stack(engine, control_plane, gateways, traced)


async def _complete(session: aiohttp.ClientSession, gateway: AdmissionGateway) -> None:
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": TOKENS, "ignore_eos": True}
    async with session.post(
        f"{gateway.url}/v1/completions",
        json=payload,
        headers={"Authorization": f"Bearer {KEY_B}"},
    ) as response:
        assert response.status == 200, await response.text()
        await response.read()


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {})[key]


def _ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _one(spans: Sequence[ReadableSpan], message: str) -> ReadableSpan:
    assert len(spans) == 1, f"{message}: {[s.name for s in spans]}"
    return spans[0]


async def test_decision_request_and_their_links_form_connected_traces(stack: Stack) -> None:
    state = stack.control_plane.pools["default"]
    await wait_until(
        lambda: state.gateways_connected == 2 and state.telemetry is not None,
        message="both gateways and the agent connected",
    )
    # B floods gateway 0 beyond its share there; the next decision gives B the idle A's slots.
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(_complete(session, stack.gateways[0]) for _ in range(6)))
    cp, gw0, gw1 = (stack.traced[n] for n in ("controlplane", "gateway-0", "gateway-1"))

    published = [
        s
        for s in cp.spans("decision")
        if s.attributes is not None and s.attributes["slotshift.decision.outcome"] == "published"
    ]
    assert published, "B's backlog did not move any slot"
    decision = published[0]
    trace_id, decision_id = _ids(decision)
    attributes: dict[str, Any] = dict(decision.attributes or {})
    assert decision.parent is None, "a decision is a trace of its own"
    assert attributes["slotshift.pool"] == "default"
    assert attributes["slotshift.decision.policy"] == "demand"
    assert attributes["slotshift.decision.input.B.demand_slots"] > 0
    assert attributes["slotshift.decision.output.B.limit_slots"] > 4
    assert attributes["slotshift.decision.version"] == _version_published_by(cp, decision)
    assert attributes["slotshift.decision.telemetry.present"] is True
    assert attributes["slotshift.decision.telemetry.stale"] is False

    # Linked to the agent's span that sent the report it used.
    sends = {_ids(s) for s in stack.traced["agent"].spans("telemetry.send")}
    assert {(link.context.trace_id, link.context.span_id) for link in decision.links} <= sends
    assert decision.links, "the decision used telemetry, so it links to the report's span"

    # decision -> push (to each gateway; re-grants as slots drain are pushed under it too) ->
    # apply at that gateway.
    pushes = [s for s in cp.spans("allocation.push") if _parent_id(s) == decision_id]
    gateways = {"gw-0": gw0, "gw-1": gw1}
    assert {_attr(s, "slotshift.gateway.id") for s in pushes} == set(gateways)
    for push in pushes:
        assert push.kind is trace.SpanKind.PRODUCER
        assert _ids(push)[0] == trace_id
        gateway = gateways[str(_attr(push, "slotshift.gateway.id"))]
        apply = _one(
            [s for s in gateway.spans("allocation.apply") if _parent_id(s) == _ids(push)[1]],
            "the gateway's apply of the push",
        )
        assert _ids(apply)[0] == trace_id
        assert _attr(apply, "slotshift.allocation.applied") is True

    # The requests: server span -> queue wait, upstream call -> the engine's llm_request.
    requests = gw0.spans("POST /v1/completions")
    assert len(requests) == 6
    engine_spans = {_parent_id(s): s for s in stack.traced["engine-sim"].spans("llm_request")}
    for request in requests:
        request_trace, request_id = _ids(request)
        assert request.kind is trace.SpanKind.SERVER
        assert _attr(request, "slotshift.tenant") == "B"
        assert _attr(request, "slotshift.admission.outcome") == "admitted"
        assert _attr(request, "http.response.status_code") == 200
        children = [s for s in gw0.spans() if _parent_id(s) == request_id]
        assert sorted(s.name for s in children) == ["queue wait", "upstream POST /v1/completions"]
        upstream = next(s for s in children if s.kind is trace.SpanKind.CLIENT)
        llm = engine_spans[_ids(upstream)[1]]
        assert _ids(llm)[0] == request_trace
        assert _attr(llm, "gen_ai.usage.completion_tokens") == TOKENS

    # Those that waited for B's raise are linked to the decision that raised it.
    linked = [
        r
        for r in requests
        if any(
            (link.context.trace_id, link.context.span_id) == (trace_id, decision_id)
            for link in r.links
        )
    ]
    assert linked, "no request links to the decision whose allocation admitted it"
    assert all(
        _attr(r, "slotshift.allocation.version") >= attributes["slotshift.decision.version"]
        for r in linked
    )


def _version_published_by(cp: Traced, decision: ReadableSpan) -> int:
    versions = {
        int(_attr(s, "slotshift.allocation.version"))
        for s in cp.spans("allocation.push")
        if _parent_id(s) == _ids(decision)[1]
    }
    return min(versions)


async def test_a_gateways_connection_is_one_trace_across_both_sides(stack: Stack) -> None:
    state = stack.control_plane.pools["default"]
    await wait_until(lambda: state.gateways_connected == 2, message="both gateways connected")
    cp = stack.traced["controlplane"]
    for index in range(2):
        connect = _one(
            stack.traced[f"gateway-{index}"].spans("controlplane.connect"), "one connection"
        )
        served = _one(
            [s for s in cp.spans("gateway.connect") if _parent_id(s) == _ids(connect)[1]],
            "the control plane's side of it",
        )
        assert _ids(served)[0] == _ids(connect)[0]
        assert _attr(served, "slotshift.gateway.id") == f"gw-{index}"


async def test_no_span_carries_the_api_key(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        await _complete(session, stack.gateways[1])
    for traced in stack.traced.values():
        for span in traced.spans():
            for key, value in (span.attributes or {}).items():
                assert "authorization" not in key.lower()
                assert KEY_B not in str(value)
