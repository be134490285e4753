"""End to end: the traces of a real `slotshift up`, every process exporting over OTLP/gRPC to a
real receiver (tests/otlp_receiver.py), as they would to Jaeger.

One run, shared by the module: tenant B floods gateway 0 with long requests while tenant A
idles, so the control plane moves A's slots to B. Then:
- the decision that moved them is one trace across the control plane and both gateways
  (decision -> allocation.push -> allocation.apply, under three service names);
- a request is one trace across the gateway and the engine (server span -> upstream client
  span -> the emulator's llm_request), continuing the client's own traceparent;
- the requests admitted under the new allocation link to that decision's span.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai
import pytest

from tests.e2e.conftest import RunningStack, running_stack
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan, receiver_thread, wait_for_spans

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-3B-Instruct"
CONTROLPLANE = "slotshift-controlplane"
GATEWAY = "slotshift-gateway"
ENGINE = "slotshift-engine-sim"
AGENT = "slotshift-agent"
# Long enough that B's requests are still queued when the next decision (every 0.5 s) runs.
TOKENS = 400
CONCURRENT = 6


@dataclass
class TracedRun:
    stack: RunningStack
    receiver: OtlpReceiver
    client_trace_id: str
    client_span_id: str


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedRun]:
    with receiver_thread() as receiver:
        environment = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        # A small budget, so that six requests are a backlog: B holds 2 slots per gateway at
        # rest and may borrow up to 7 of the 8 while A idles at its floor of 1.
        overrides = {
            "pools.0.budget_slots": 8,
            "pools.0.tenants.0.floor_slots": 1,
            "pools.0.tenants.1.floor_slots": 1,
        }
        with running_stack(
            tmp_path_factory.mktemp("traced-stack"),
            environment=environment,
            overrides=overrides,
            period_s=0.5,
        ) as stack:
            client_trace_id, client_span_id = secrets.token_hex(16), secrets.token_hex(8)
            client = openai.OpenAI(
                base_url=f"{stack.gateway_urls[0]}/v1", api_key="demo-key-b", max_retries=0
            )

            def complete(index: int) -> None:
                # The first request comes with a trace of the client's own.
                headers = (
                    {"traceparent": f"00-{client_trace_id}-{client_span_id}-01"}
                    if index == 0
                    else {}
                )
                completion = client.completions.create(
                    model=MODEL,
                    prompt="trace me",
                    max_tokens=TOKENS,
                    extra_body={"ignore_eos": True},
                    extra_headers=headers,
                )
                assert completion.usage is not None
                assert completion.usage.completion_tokens == TOKENS

            with ThreadPoolExecutor(CONCURRENT) as pool:
                list(pool.map(complete, range(CONCURRENT)))
            yield TracedRun(stack, receiver, client_trace_id, client_span_id)


def _published_decisions(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    return receiver.spans(
        lambda s: (
            s.service == CONTROLPLANE
            and s.name == "decision"
            and s.attributes.get("slotshift.decision.outcome") == "published"
        )
    )


def _decision_moving_slots_to_b(run: TracedRun) -> ReceivedSpan:
    decisions = wait_for_spans(
        run.receiver,
        lambda s: (
            s.service == CONTROLPLANE
            and s.name == "decision"
            and s.attributes.get("slotshift.decision.outcome") == "published"
            and s.attributes.get("slotshift.decision.output.B.limit_slots", 0) > 4
        ),
        message="a published decision giving B more than its nominal 4 slots",
    )
    return decisions[0]


def test_a_decision_is_one_trace_across_the_control_plane_and_both_gateways(
    traced_run: TracedRun,
) -> None:
    receiver = traced_run.receiver
    decision = _decision_moving_slots_to_b(traced_run)
    assert decision.parent_span_id == "", "every decision is a trace of its own"
    assert decision.attributes["slotshift.pool"] == "default"
    assert decision.attributes["slotshift.decision.policy"] == "demand"
    assert decision.attributes["slotshift.decision.input.B.demand_slots"] > 0
    assert isinstance(decision.attributes["slotshift.decision.version"], int)
    assert "slotshift.decision.telemetry.age_s" in decision.attributes

    def pushes() -> list[ReceivedSpan]:
        return receiver.spans(
            lambda s: s.name == "allocation.push" and s.parent_span_id == decision.span_id
        )

    wait_for_spans(
        receiver,
        lambda s: (
            s.name == "allocation.push"
            and s.parent_span_id == decision.span_id
            and {p.attributes["slotshift.gateway.id"] for p in pushes()}
            == {"gateway-0", "gateway-1"}
        ),
        message="the decision's pushes to both gateways",
    )
    for push in pushes():
        assert (push.service, push.kind, push.trace_id) == (
            CONTROLPLANE,
            "producer",
            decision.trace_id,
        )
        apply = wait_for_spans(
            receiver,
            _child_of(push, "allocation.apply"),
            message=f"gateway {push.attributes['slotshift.gateway.id']} applying the push",
        )
        assert len(apply) == 1
        assert apply[0].service == GATEWAY
        assert apply[0].trace_id == decision.trace_id
        assert (
            apply[0].attributes["slotshift.gateway.id"] == push.attributes["slotshift.gateway.id"]
        )
        version = push.attributes["slotshift.allocation.version"]
        assert apply[0].attributes["slotshift.allocation.version"] == version


def _child_of(parent: ReceivedSpan, name: str) -> Callable[[ReceivedSpan], bool]:
    return lambda s: s.name == name and s.parent_span_id == parent.span_id


def test_the_decision_links_to_the_agents_telemetry_report(traced_run: TracedRun) -> None:
    decision = _decision_moving_slots_to_b(traced_run)
    assert decision.links, "a decision made with telemetry links to the report it used"
    link = decision.links[0]
    reports = wait_for_spans(
        traced_run.receiver,
        lambda s: s.service == AGENT and s.name == "telemetry.send" and s.span_id == link.span_id,
        message="the agent's span that sent the report",
    )
    assert reports[0].trace_id == link.trace_id
    assert reports[0].attributes["slotshift.telemetry.scrape_ok"] is True


def _request_spans(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    return wait_for_spans(
        receiver,
        lambda s: s.service == GATEWAY and s.name == "POST /v1/completions",
        message="the gateway's request spans",
    )


def test_a_request_is_one_trace_across_the_gateway_and_the_engine(
    traced_run: TracedRun,
) -> None:
    receiver = traced_run.receiver
    wait_for_spans(
        receiver,
        lambda s: (
            s.service == GATEWAY
            and s.name == "POST /v1/completions"
            and s.trace_id == traced_run.client_trace_id
        ),
        message="the request that came with the client's traceparent",
    )
    request = next(s for s in _request_spans(receiver) if s.trace_id == traced_run.client_trace_id)
    assert request.kind == "server"
    assert request.parent_span_id == traced_run.client_span_id, "it continues the client's trace"
    assert request.attributes["slotshift.tenant"] == "B"
    assert request.attributes["slotshift.gateway.id"] == "gateway-0"
    assert request.attributes["slotshift.admission.outcome"] == "admitted"
    assert request.attributes["http.response.status_code"] == 200
    assert isinstance(request.attributes["slotshift.allocation.version"], int)
    for key, value in request.attributes.items():
        assert "authorization" not in key.lower() and "demo-key" not in str(value)

    children = wait_for_spans(
        receiver,
        lambda s: s.parent_span_id == request.span_id,
        message="the request's children",
    )
    assert {s.name for s in children} <= {"queue wait", "upstream POST /v1/completions"}
    upstream = wait_for_spans(
        receiver,
        lambda s: s.parent_span_id == request.span_id and s.kind == "client",
        message="the upstream call",
    )[0]
    assert upstream.name == "upstream POST /v1/completions"
    assert upstream.attributes["http.response.status_code"] == 200
    engine = wait_for_spans(
        receiver,
        lambda s: s.service == ENGINE and s.parent_span_id == upstream.span_id,
        message="the engine continuing the trace",
    )
    assert len(engine) == 1
    assert engine[0].name == "llm_request"
    assert engine[0].kind == "server"
    assert engine[0].trace_id == request.trace_id
    assert engine[0].attributes["gen_ai.usage.completion_tokens"] == TOKENS
    assert "gen_ai.latency.time_in_queue" in engine[0].attributes
    queue_waits = [s for s in receiver.spans() if s.name == "queue wait"]
    assert any(s.parent_span_id == request.span_id for s in queue_waits)


def test_requests_admitted_under_the_decision_link_to_it(traced_run: TracedRun) -> None:
    receiver = traced_run.receiver
    _decision_moving_slots_to_b(traced_run)
    decisions = {(d.trace_id, d.span_id): d for d in _published_decisions(receiver)}

    def linked() -> list[tuple[ReceivedSpan, ReceivedSpan]]:
        return [
            (request, decisions[(link.trace_id, link.span_id)])
            for request in _request_spans(receiver)
            for link in request.links
            if (link.trace_id, link.span_id) in decisions
        ]

    wait_for_spans(
        receiver,
        lambda _: bool(linked()),
        message="a request span linking to the decision whose allocation admitted it",
    )
    for request, decision in linked():
        assert request.attributes["slotshift.tenant"] == "B"
        assert (
            request.attributes["slotshift.allocation.version"]
            >= (decision.attributes["slotshift.decision.version"])
        )
        assert decision.attributes["slotshift.decision.output.B.limit_slots"] > 4
