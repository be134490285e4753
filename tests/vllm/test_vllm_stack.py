"""End to end against real vLLM: `slotshift up --engine vllm` driven by the official openai client
and the real grpcurl binary, with vLLM's own /metrics as the witness of what is inside it."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from admission_gateway.upstream import EngineClient
from telemetry_agent.vllm_metrics import parse_vllm_metrics
from tests.grpcurl import (
    decided_at_s,
    decided_demand,
    decided_limit,
    decisions,
    first_grant,
    grpcurl,
    limits,
)
from tests.metric_shapes import KNOWN_DIFFERENCES, emulator_scrape, shape_differences
from tests.otlp_receiver import ReceivedSpan, wait_for_spans
from tests.support import wait_until_sync
from tests.vllm.conftest import (
    ALIAS,
    BUDGET_SLOTS,
    FLOOR_SLOTS,
    MAX_NUM_SEQS,
    MODEL,
    PERIOD_S,
    VllmStack,
)
from tests.vllm.probes import (
    NOMINAL_SLOTS,
    Sampler,
    gateways_in_flight,
    http_get,
    tenants,
    vllm_counter,
    vllm_snapshot,
    wait_at_rest,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

GATEWAY = "slotshift-gateway"
REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM = "vllm"


# --- clients and probes ---------------------------------------------------------------------


def _client(stack: VllmStack, key: str, gateway: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_urls[gateway]}/v1", api_key=key, max_retries=0)


@dataclass
class Load:
    """Closed-loop clients sending requests through the gateways until finished, from a process
    of their own (tests/vllm/load_process.py says why); failures are kept."""

    stack: VllmStack
    key: str
    max_tokens: int
    failures: list[str] = field(default_factory=list)
    completed: int = 0
    _process: subprocess.Popen[str] | None = None

    def start(self, clients: int) -> None:
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.vllm.load_process",
                self.key,
                MODEL,
                str(self.max_tokens),
                str(clients),
                *self.stack.gateway_urls,
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        # The clients send from when it says so (load_process.py): what the test times runs
        # from there, and a finish() can no longer come before its SIGTERM handler.
        assert self._process.stdout is not None
        ready = self._process.stdout.readline().strip()
        assert ready == "ready", f"the load process did not start: {ready!r}"

    def finish(self) -> None:
        """Stop sending; returns once every client's last request has ended. Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        out, _ = process.communicate(timeout=150)
        outcome = json.loads(out.strip().splitlines()[-1])
        self.completed += outcome["completed"]
        self.failures.extend(outcome["failures"])


# --- the OpenAI API through the gateways ---------------------------------------------------


def test_openai_client_completions_and_chat_through_both_gateways(vllm_stack: VllmStack) -> None:
    for gateway in (0, 1):
        client = _client(vllm_stack, "demo-key-a", gateway)
        assert [m.id for m in client.models.list()] == [MODEL, ALIAS]
        completion = client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=8, extra_body={"ignore_eos": True}
        )
        assert completion.model == MODEL
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None and completion.usage.completion_tokens == 8
        chat = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        assert chat.choices[0].message.role == "assistant"
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage is not None and chat.usage.completion_tokens == 5
        # The chat template wraps the message: more prompt tokens than "Hello" alone.
        assert completion.usage.prompt_tokens < chat.usage.prompt_tokens


def test_an_alias_reaches_the_same_engine_and_an_unknown_model_stays_at_the_gateway(
    vllm_stack: VllmStack,
) -> None:
    """Routing by name on one real engine: the pool lists both names vLLM serves (aliases of one
    engine are one pool and one budget), so either name is routed to it; vLLM answers with its
    first served name whatever alias was asked. A model no pool serves gets the gateway's own
    404, never reaching vLLM."""
    client = _client(vllm_stack, "demo-key-a")
    by_alias = client.completions.create(
        model=ALIAS, prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert by_alias.model == MODEL, "vLLM names its first served name"
    assert by_alias.usage is not None and by_alias.usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="gpt-4", prompt="Hello", max_tokens=4)
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"


def test_openai_client_streaming(vllm_stack: VllmStack) -> None:
    client = _client(vllm_stack, "demo-key-b")
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    # One delta per token, less any a partial UTF-8 character holds back (the tiny model's
    # tokens are random bytes as often as words).
    assert 6 <= sum(1 for d in deltas if d) <= 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    completion_chunks = list(
        client.completions.create(
            model=MODEL, prompt="Count", max_tokens=4, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert completion_chunks[-1].choices[0].finish_reason == "length"
    assert 2 <= sum(1 for c in completion_chunks if c.choices and c.choices[0].text) <= 4


# --- the control plane through grpcurl -----------------------------------------------------


def test_grpcurl_lists_services_and_health_is_serving(vllm_stack: VllmStack) -> None:
    services = grpcurl(vllm_stack, "list").split()
    for name in (
        "slotshift.v1.AllocationService",
        "slotshift.v1.GatewayService",
        "slotshift.v1.TelemetryService",
        "grpc.health.v1.Health",
    ):
        assert name in services
    health = json.loads(grpcurl(vllm_stack, "grpc.health.v1.Health/Check", data='{"service": ""}'))
    assert health["status"] == "SERVING"


def test_grpcurl_reads_an_allocation_that_sums_to_the_budget(vllm_stack: VllmStack) -> None:
    allocation = json.loads(
        grpcurl(
            vllm_stack, "slotshift.v1.AllocationService/GetAllocation", data='{"pool": "default"}'
        )
    )
    assert allocation["budget_slots"] == BUDGET_SLOTS
    assert sum(t.get("limit_slots", 0) for t in allocation["tenants"]) == BUDGET_SLOTS
    targets = sum(
        limit.get("target_slots", 0) for g in allocation["gateways"] for limit in g["tenants"]
    )
    assert targets == BUDGET_SLOTS
    pools = json.loads(grpcurl(vllm_stack, "slotshift.v1.AllocationService/ListPools"))
    assert pools["pools"][0]["gateways_connected"] == 2


# --- slots move, and the budget holds inside vLLM ------------------------------------------


def test_backlogged_tenant_gains_slots_from_an_idle_one_within_two_periods(
    vllm_stack: VllmStack,
) -> None:
    wait_at_rest(vllm_stack)
    load = Load(vllm_stack, "demo-key-b", max_tokens=64)
    load.start(clients=3 * BUDGET_SLOTS)
    # B's backlog begins as its clients send: once the load process says it is ready.
    load_started_s = time.time()
    try:
        wait_until_sync(
            lambda: limits(vllm_stack)["B"] > NOMINAL_SLOTS,
            timeout_s=30,
            message="B to gain slots",
        )
        granted = first_grant(vllm_stack, "B", above_slots=NOMINAL_SLOTS, since_s=load_started_s)
        assert decided_at_s(granted) - load_started_s <= 2 * PERIOD_S, granted
        assert decided_demand(granted, "B") > 0
        assert decided_limit(granted, "A") >= FLOOR_SLOTS
        # vLLM itself runs more of B's requests than B's nominal share.
        wait_until_sync(
            lambda: vllm_snapshot(vllm_stack).num_requests_running > NOMINAL_SLOTS,
            # Each reading is one instant, and /metrics answers in seconds on two busy cores.
            timeout_s=30,
            message="vLLM to run more than B's nominal share",
        )
    finally:
        load.finish()
    assert load.failures == []
    wait_at_rest(vllm_stack)


def test_vllm_never_holds_more_than_the_budget_while_slots_move(vllm_stack: VllmStack) -> None:
    wait_at_rest(vllm_stack)
    version_before = json.loads(grpcurl(vllm_stack, "slotshift.v1.AllocationService/ListPools"))[
        "pools"
    ][0]["allocation_version"]
    b = Load(vllm_stack, "demo-key-b", max_tokens=48)
    a = Load(vllm_stack, "demo-key-a", max_tokens=16)
    with Sampler(vllm_stack) as sampler:
        try:
            b.start(clients=2 * BUDGET_SLOTS)
            # The scenario's timeline: A idles while B borrows (a decision or two; on two cores
            # shared with vLLM one can come late, so wait for it rather than a fixed time).
            # This wait is the check that B borrows (not a second reading after it: the demand
            # policy follows B's demand of the moment, and a later reading may meet a lull).
            wait_until_sync(
                lambda: limits(vllm_stack)["B"] > NOMINAL_SLOTS,
                timeout_s=20,
                interval_s=0.5,
                message="B to borrow A's idle share",
            )
            a.start(clients=2 * BUDGET_SLOTS)
            # A bursts: its slots come back from B. Read A's limit through the burst, not at
            # one instant: a decision that meets a lull (vLLM ends a batch of equal answers in
            # one step, and every client is between two requests) gives the nominal shares
            # back until the next one.
            a_limits: list[int] = []
            bursting_until = time.monotonic() + 6.0
            while time.monotonic() < bursting_until:
                a_limits.append(limits(vllm_stack)["A"])
                time.sleep(0.5)
            a.finish()
            time.sleep(3.0)  # A idles again
        finally:
            a.finish()
            b.finish()
    version_after = json.loads(grpcurl(vllm_stack, "slotshift.v1.AllocationService/ListPools"))[
        "pools"
    ][0]["allocation_version"]
    assert a.failures == [] and b.failures == []
    assert a.completed > 0 and b.completed > 0
    assert max(a_limits) > FLOOR_SLOTS, a_limits
    assert int(version_after) >= int(version_before) + 2, "slots did not move during the load"
    # The witness: vLLM's own running + waiting, never above the budget.
    sampler.assert_never_above(BUDGET_SLOTS)
    # ... while the load could have held far more (the gauge is not stuck low).
    assert max(sampler.vllm_in_server) >= BUDGET_SLOTS - 4
    assert BUDGET_SLOTS < MAX_NUM_SEQS  # so vLLM itself would have let more in
    wait_at_rest(vllm_stack)


# --- faults ----------------------------------------------------------------------------------


def test_slots_come_back_when_clients_disconnect_mid_stream(vllm_stack: VllmStack) -> None:
    wait_until_sync(
        lambda: gateways_in_flight(vllm_stack) == 0, timeout_s=30, message="nothing in flight"
    )
    finished_before = vllm_counter(vllm_stack, "vllm:request_success")
    aborted_before = vllm_counter(vllm_stack, "vllm:request_success", finished_reason="abort")
    count = BUDGET_SLOTS - 4
    clients = [
        _client(vllm_stack, "demo-key-b" if index % 2 else "demo-key-a", index % 2)
        for index in range(count)
    ]
    start = threading.Barrier(count)
    abandoned: list[int] = []
    lock = threading.Lock()

    def abandon_stream(index: int) -> None:
        start.wait()  # all at once: the tiny model would finish one before the next began
        stream = clients[index].completions.create(
            model=MODEL,
            prompt="long",
            max_tokens=480,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        next(stream)  # the request is inside vLLM and streaming ...
        stream.close()  # ... when its client goes away
        with lock:
            abandoned.append(index)

    threads = [threading.Thread(target=abandon_stream, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(abandoned) == count
    wait_until_sync(
        lambda: gateways_in_flight(vllm_stack) == 0,
        timeout_s=10,
        message="the gateways to release the slots",
    )
    wait_until_sync(
        lambda: vllm_snapshot(vllm_stack).num_requests_running == 0,
        timeout_s=10,
        message="vLLM to drop the requests",
    )
    assert vllm_snapshot(vllm_stack).num_requests_waiting == 0
    wait_until_sync(
        lambda: all(t["in_flight"] == 0 for t in tenants(vllm_stack).values()),
        timeout_s=5,
        message="the control plane to see nothing in flight",
    )
    # Most were aborted, not run to their end: only those that did finish are counted, since
    # vLLM 0.32 counts a client's abort in no request metric. The emulator does the same
    # (tests/unit/engine_sim/test_server.py); this fails if a new vLLM starts counting them.
    finished = vllm_counter(vllm_stack, "vllm:request_success") - finished_before
    assert finished <= count // 2
    aborted = vllm_counter(vllm_stack, "vllm:request_success", finished_reason="abort")
    assert aborted == aborted_before


VLLM_KEEP_ALIVE_S = 5.0
"""vLLM closes a connection idle this long (VLLM_HTTP_TIMEOUT_KEEP_ALIVE's default)."""


def test_requests_after_the_engines_keep_alive_ran_out_all_succeed(vllm_stack: VllmStack) -> None:
    # The keep-alive race (issue #12): a gateway that reuses a pooled connection vLLM is closing
    # at that moment used to fail the request with 502 upstream_unavailable.
    clients = [_client(vllm_stack, "demo-key-a", g) for g in range(len(vllm_stack.gateway_urls))]
    per_gateway = NOMINAL_SLOTS // 2
    failures: list[str] = []
    lock = threading.Lock()

    def burst() -> None:
        """per_gateway requests at once through each gateway: each gateway pools that many
        connections to vLLM, or reuses them."""
        start = threading.Barrier(per_gateway * len(clients))

        def one(client: openai.OpenAI) -> None:
            start.wait()
            try:
                completion = client.completions.create(
                    model=MODEL, prompt="idle", max_tokens=4, extra_body={"ignore_eos": True}
                )
            except openai.APIError as exc:
                with lock:
                    failures.append(repr(exc))
                return
            if completion.usage is None or completion.usage.completion_tokens != 4:
                with lock:
                    failures.append(f"usage {completion.usage}")

        threads = [
            threading.Thread(target=one, args=(client,), name="keep-alive")
            for client in clients
            for _ in range(per_gateway)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)

    burst()
    # Deliberate idle waits: the connections' idle time is the condition under test. First just
    # at vLLM's keep-alive, where its close and the gateway's reuse can cross, then past it.
    for idle_s in (VLLM_KEEP_ALIVE_S, VLLM_KEEP_ALIVE_S + 1.0):
        time.sleep(idle_s)
        burst()
    assert failures == []


def test_a_pooled_connection_vllm_closed_is_sent_again_and_vllm_runs_it_once(
    vllm_stack: VllmStack, caplog: pytest.LogCaptureFixture
) -> None:
    # The race made certain, with the gateway's own upstream client: its event loop is blocked
    # past vLLM's keep-alive (a deliberate wait: the condition under test), so that the pooled
    # connection vLLM closed meanwhile still looks open when the next request takes it.
    url = f"{vllm_stack.vllm_url}/v1/completions"
    body = json.dumps({"model": MODEL, "prompt": "stale", "max_tokens": 4, "ignore_eos": True})

    async def two_requests() -> list[int]:
        statuses = []
        async with EngineClient(engine_ssl=True, keepalive_timeout_s=60) as client:
            for index in range(2):
                if index:
                    time.sleep(VLLM_KEEP_ALIVE_S + 1.0)  # noqa: ASYNC251 (see above)
                response = await client.send(
                    "POST",
                    url,
                    data=body.encode(),
                    headers={"Content-Type": "application/json"},
                    timeout_s=60,
                )
                statuses.append(response.status)
                await response.read()
                response.release()
        return statuses

    finished_before = vllm_counter(vllm_stack, "vllm:request_success")
    with caplog.at_level(logging.INFO, logger="admission_gateway.upstream"):
        assert asyncio.run(two_requests()) == [200, 200]
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 1
    # vLLM never got the copy sent on the closed connection.
    assert vllm_counter(vllm_stack, "vllm:request_success") - finished_before == 2


# --- telemetry -------------------------------------------------------------------------------


def test_the_agent_reads_real_vllm_and_the_control_plane_sees_it(vllm_stack: VllmStack) -> None:
    agent = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in text_string_to_metric_families(http_get(vllm_stack.agent_metrics_url))
        for s in m.samples
    }
    errors = {
        dict(labels)["reason"]: v
        for (name, labels), v in agent.items()
        if name == "slotshift_agent_scrape_errors" and v > 0
    }
    scrapes = sum(v for (name, _), v in agent.items() if name == "slotshift_agent_scrapes")
    assert scrapes > 0
    # Every answer vLLM gave was read: none unparsable, none not vLLM's, none refused. While
    # vLLM streams to many clients on two busy cores, /metrics may now and then miss the
    # agent's 2 s scrape timeout; that is the engine's time, not a misreading.
    assert set(errors) <= {"timeout"}, errors
    assert errors.get("timeout", 0) <= 0.1 * scrapes, (errors, scrapes)
    telemetry = decisions(vllm_stack, limit=1)[0]["telemetry"]
    assert telemetry.get("fresh") is True
    assert telemetry.get("gpu_emulated", False) is False  # a real engine: no modelled GPU


def test_emulator_metrics_have_live_vllms_names_types_and_labels(vllm_stack: VllmStack) -> None:
    live = http_get(f"{vllm_stack.vllm_url}/metrics")
    assert parse_vllm_metrics(live).model_name == MODEL
    assert shape_differences(asyncio.run(emulator_scrape()), live) == KNOWN_DIFFERENCES


# --- tracing (written last; needs the services' OpenTelemetry tracing) ----------------------


def test_a_request_trace_continues_into_vllm(vllm_stack: VllmStack) -> None:
    receiver = vllm_stack.receiver
    trace_id, client_span_id = secrets.token_hex(16), secrets.token_hex(8)
    completion = _client(vllm_stack, "demo-key-a").completions.create(
        model=MODEL,
        prompt="trace me",
        max_tokens=4,
        extra_body={"ignore_eos": True},
        extra_headers={"traceparent": f"00-{trace_id}-{client_span_id}-01"},
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 4

    def in_trace(service: str, kind: str) -> Callable[[ReceivedSpan], bool]:
        return lambda s: s.service == service and s.trace_id == trace_id and s.kind == kind

    # Each process exports in its own batches: wait for each span on its own.
    (server,) = wait_for_spans(
        receiver, in_trace(GATEWAY, "server"), timeout_s=15, message="the gateway's server span"
    )
    assert server.parent_span_id == client_span_id
    (upstream,) = wait_for_spans(
        receiver, in_trace(GATEWAY, "client"), timeout_s=15, message="the gateway's upstream span"
    )
    assert upstream.parent_span_id == server.span_id
    (engine,) = wait_for_spans(
        receiver, in_trace(VLLM, "server"), timeout_s=15, message="vLLM's span of the request"
    )
    assert engine.parent_span_id == upstream.span_id
    assert engine.name == "llm_request"
    assert engine.attributes.get("gen_ai.usage.completion_tokens") == 4
