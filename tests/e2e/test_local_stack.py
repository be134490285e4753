"""End to end: real processes started with `slotshift up`, real clients (the official openai
client, the real grpcurl binary)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import openai
import pytest

from slotshift_tools.metrics_scrape import Samples, parse_samples
from tests.e2e.conftest import RunningStack
from tests.grpcurl import decided_at_s, decided_demand, first_grant, grpcurl, limits
from tests.support import wait_until_sync

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-3B-Instruct"


def _client(stack: RunningStack, key: str, gateway: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_urls[gateway]}/v1", api_key=key, max_retries=0)


def test_openai_client_completions_and_chat_through_both_gateways(
    local_stack: RunningStack,
) -> None:
    for gateway in (0, 1):
        client = _client(local_stack, "demo-key-a", gateway)
        assert [m.id for m in client.models.list()] == [MODEL]
        completion = client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=8, extra_body={"ignore_eos": True}
        )
        assert completion.usage is not None and completion.usage.completion_tokens == 8
        chat = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.completion_tokens == 5


def test_openai_client_streaming(local_stack: RunningStack) -> None:
    client = _client(local_stack, "demo-key-b")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 12
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    completion_stream = client.completions.create(
        model=MODEL, prompt="Count", max_tokens=4, stream=True, extra_body={"ignore_eos": True}
    )
    assert len([c for c in completion_stream if c.choices and c.choices[0].text]) == 4


def test_wrong_key_is_refused_with_an_openai_error(local_stack: RunningStack) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        _client(local_stack, "not-a-key").models.list()
    assert raised.value.status_code == 401


def test_grpcurl_lists_services_and_health_is_serving(local_stack: RunningStack) -> None:
    services = grpcurl(local_stack, "list").split()
    for name in (
        "slotshift.v1.AllocationService",
        "slotshift.v1.GatewayService",
        "slotshift.v1.TelemetryService",
        "grpc.health.v1.Health",
    ):
        assert name in services
    health = json.loads(grpcurl(local_stack, "grpc.health.v1.Health/Check", data='{"service": ""}'))
    assert health["status"] == "SERVING"
    described = grpcurl(local_stack, "describe", "slotshift.v1.AllocationService")
    assert "rpc GetAllocation" in described


def test_grpcurl_reads_an_allocation_that_sums_to_the_budget(local_stack: RunningStack) -> None:
    allocation = json.loads(
        grpcurl(
            local_stack, "slotshift.v1.AllocationService/GetAllocation", data='{"pool": "default"}'
        )
    )
    assert allocation["pool"] == "default"
    assert allocation["budget_slots"] == 96
    assert sum(t.get("limit_slots", 0) for t in allocation["tenants"]) == 96
    gateways = allocation["gateways"]
    assert len(gateways) == 2
    targets = sum(lim.get("target_slots", 0) for g in gateways for lim in g["tenants"])
    assert targets == 96
    pools = json.loads(grpcurl(local_stack, "slotshift.v1.AllocationService/ListPools"))
    assert pools["pools"][0]["gateways_connected"] == 2


def test_backlogged_tenant_gains_slots_from_an_idle_one_within_two_periods(
    local_stack: RunningStack,
) -> None:
    at_rest = {"A": 48, "B": 48}
    wait_until_sync(
        lambda: limits(local_stack) == at_rest, timeout_s=20, message="the stack at rest"
    )
    stop = threading.Event()
    # Built before the clock starts: building 80 clients takes seconds on two busy cores.
    clients = [_client(local_stack, "demo-key-b", i % 2) for i in range(80)]

    def backlog(client: openai.OpenAI) -> None:
        while not stop.is_set():
            client.completions.create(
                model=MODEL, prompt="batch", max_tokens=64, extra_body={"ignore_eos": True}
            )

    workers = [threading.Thread(target=backlog, args=(c,), name="backlog") for c in clients]
    backlog_started_s = time.time()
    for worker in workers:
        worker.start()
    try:
        wait_until_sync(
            lambda: limits(local_stack)["B"] > 48, timeout_s=20, message="B to gain slots"
        )
        granted = first_grant(local_stack, "B", above_slots=48, since_s=backlog_started_s)
        assert decided_at_s(granted) - backlog_started_s <= 2 * local_stack.decision_period_s, (
            granted
        )
        assert decided_demand(granted, "B") > 0
        assert granted["outcome"] == "DECISION_OUTCOME_PUBLISHED"
        assert granted["policy"] == "demand"
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
    wait_until_sync(
        lambda: limits(local_stack) == at_rest, timeout_s=20, message="the stack at rest again"
    )


def test_a_lenders_burst_pauses_borrowed_work_which_resumes_without_loss(
    local_stack: RunningStack,
) -> None:
    """B (preemptible in the demo config) borrows A's idle share through the official openai
    client, mostly non-streamed completions and some streamed chats (fewer streams: 100 streaming
    clients in one Python process would be the bottleneck, not the stack); A bursts; the
    gateways pause B's youngest borrowed requests and resume them. Every B answer still has
    exactly the tokens it asked for, one id and true usage, and the engine's own per-step
    high-water mark stays within the budget."""
    at_rest = {"A": 48, "B": 48}
    wait_until_sync(
        lambda: limits(local_stack) == at_rest, timeout_s=20, message="the stack at rest"
    )
    pauses_before = _pauses(local_stack, "B")
    stop = threading.Event()
    failures: list[str] = []
    answers: list[tuple[int, int, int]] = []
    """(ids seen, text chunks or -1 when not streamed, completion tokens) per B answer."""

    def completions(client: openai.OpenAI) -> None:
        while not stop.is_set():
            try:
                answer = client.completions.create(
                    model=MODEL, prompt="batch", max_tokens=160, extra_body={"ignore_eos": True}
                )
                assert answer.usage is not None
                answers.append((1, -1, answer.usage.completion_tokens))
            except openai.OpenAIError as exc:
                failures.append(repr(exc))

    def chats(client: openai.OpenAI) -> None:
        while not stop.is_set():
            try:
                stream = client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Summarise the report."}],
                    max_tokens=160,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                ids: set[str] = set()
                text_chunks = 0
                completion_tokens = -1
                for chunk in stream:
                    ids.add(chunk.id)
                    text_chunks += sum(1 for c in chunk.choices if c.delta.content)
                    if chunk.usage is not None:
                        completion_tokens = chunk.usage.completion_tokens
                answers.append((len(ids), text_chunks, completion_tokens))
            except openai.OpenAIError as exc:
                failures.append(repr(exc))

    workers = [
        threading.Thread(
            target=chats if i < 8 else completions,
            args=(_client(local_stack, "demo-key-b", i % 2),),
            name="backlog",
        )
        for i in range(80)
    ]
    for worker in workers:
        worker.start()
    try:
        wait_until_sync(lambda: limits(local_stack)["B"] > 48, timeout_s=20, message="B to borrow")
        lender = _client(local_stack, "demo-key-a")
        burst_failures: list[str] = []

        def lend() -> None:
            try:
                lender.completions.create(
                    model=MODEL, prompt="hi", max_tokens=64, extra_body={"ignore_eos": True}
                )
            except openai.OpenAIError as exc:
                burst_failures.append(repr(exc))

        burst = [threading.Thread(target=lend, name="burst") for _ in range(48)]
        for thread in burst:
            thread.start()
        for thread in burst:
            thread.join(timeout=60)
        assert not burst_failures, burst_failures[:3]
        wait_until_sync(
            lambda: _pauses(local_stack, "B") > pauses_before,
            timeout_s=20,
            message="B's borrowed requests to be paused",
        )
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
    assert not failures, failures[:3]
    assert any(chunks >= 0 for _, chunks, _ in answers), "some B answers were streamed"
    wrong = [a for a in answers if a[0] != 1 or a[2] != 160 or a[1] not in (-1, 160)]
    assert not wrong, f"{len(wrong)} of {len(answers)} B answers were not whole: {wrong[:3]}"
    peak = _engine_gauge(local_stack, "slotshift_engine_peak_requests")
    assert peak is not None and peak <= 96, peak


def _pauses(stack: RunningStack, tenant: str) -> float:
    return sum(
        value
        for url in stack.gateway_urls
        for labels, value in scrape_sync(f"{url}/metrics").get("slotshift_gateway_pauses_total", [])
        if labels.get("tenant") == tenant
    )


def _engine_gauge(stack: RunningStack, name: str) -> float | None:
    values = scrape_sync(f"{stack.engine_url}/metrics").get(name)
    return None if not values else max(value for _, value in values)


def scrape_sync(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        return parse_samples(response.read().decode())
