"""Integration, real servers on port 0 in one process (the emulator, a control plane, a gateway):
every tenant's tokens counted from the engine's usage, the usage event the gateway asked for kept
from clients who did not, a cancelled stream counting what the engine delivered, and the counts
reaching the gateway's metrics, the control plane's ListTenants and GetAllocation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import grpc
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from admission_gateway.gateway import AdmissionGateway
from slotshift.config import SlotshiftConfig, parse_config
from slotshift.v1 import query_pb2, query_pb2_grpc
from tests.integration.stack import Stack, start_stack
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY_A = "sk-tokens-tenant-a-81c2d9"
KEY_B = "sk-tokens-tenant-b-4e07aa"
PROMPT = "Count the tokens of this prompt, please"


def _config(engine_url: str, grpc_port: int) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 8,
                    "decision_period_s": 0.1,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": [KEY_A]},
                        {"name": "B", "api_keys": [KEY_B]},
                    ],
                }
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "report_interval_s": 0.05,
                "full_report_interval_s": 0.1,
            },
            # Slow enough that a stream can be cut well before its end.
            "engine_sim": {"port": 0, "step_base_ms": 5.0},
        }
    )


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield await start_stack(exits, _config, gateways=1)


async def _scraped_tokens(gateway: AdmissionGateway) -> dict[tuple[str, str, str], float]:
    """(tenant, model, kind) -> slotshift_gateway_tokens_total, from the gateway's /metrics."""
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/metrics") as got:
        text = await got.text()
    return {
        (s.labels["tenant"], s.labels["model"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "slotshift_gateway_tokens"
        for s in family.samples
        if s.name.endswith("_total")
    }


async def test_every_answer_counts_its_usage_and_the_control_plane_sums_it(stack: Stack) -> None:
    (gateway,) = stack.gateways
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key=KEY_A, max_retries=0
    ) as client:
        served = (await client.models.list()).data[0].id
        whole = await client.completions.create(model=served, prompt=PROMPT, max_tokens=5)
        assert whole.usage is not None
        # A stream whose client asked for no usage: it gets none, and the gateway counts it.
        plain = await client.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=6,
            stream=True,
        )
        plain_chunks = [chunk async for chunk in plain]
        assert plain_chunks
        assert all(chunk.choices and chunk.usage is None for chunk in plain_chunks)
        # One that asked gets its usage event, once.
        asked = await client.completions.create(
            model=served,
            prompt=PROMPT,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage async for chunk in asked if chunk.usage is not None]
        assert len(usages) == 1
    plain_content = sum(1 for c in plain_chunks if c.choices[0].delta.content)
    assert plain_content == 6

    tenant = gateway.state.tenants["A"]
    (model,) = tenant.tokens
    counted = tenant.tokens[model]
    assert counted.completion_tokens_total == 5 + 6 + 7
    # The two completions' prompts are what their usage said; the chat's is its template around
    # the same text, so at least as long.
    chat_prompt = counted.prompt_tokens_total - whole.usage.prompt_tokens - usages[0].prompt_tokens
    assert chat_prompt >= whole.usage.prompt_tokens

    scraped = await _scraped_tokens(gateway)
    assert scraped[("A", model, "prompt")] == counted.prompt_tokens_total
    assert scraped[("A", model, "completion")] == counted.completion_tokens_total

    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.control_plane.grpc_port}") as channel:
        stub = query_pb2_grpc.AllocationServiceStub(channel)

        async def listed() -> query_pb2.TenantInfo:
            tenants = await stub.ListTenants(query_pb2.ListTenantsRequest(pool="default"))
            return next(t for t in tenants.tenants if t.allocation.tenant == "A")

        async def summed() -> bool:
            tokens = (await listed()).tokens
            return (tokens.prompt_tokens_total, tokens.completion_tokens_total) == (
                counted.prompt_tokens_total,
                counted.completion_tokens_total,
            )

        await wait_until(summed, message="the control plane sums A's tokens")
        allocation = await stub.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
        rates = {r.tenant: r for r in allocation.token_rates}
        assert rates["A"].completion_tokens_total == 18
        assert "B" not in rates or rates["B"].completion_tokens_total == 0


async def test_a_rate_shows_while_a_tenant_streams(stack: Stack) -> None:
    (gateway,) = stack.gateways
    async with (
        openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=KEY_B, max_retries=0) as client,
        grpc.aio.insecure_channel(f"127.0.0.1:{stack.control_plane.grpc_port}") as channel,
    ):
        served = (await client.models.list()).data[0].id
        stub = query_pb2_grpc.AllocationServiceStub(channel)

        async def streaming_rate() -> bool:
            await client.completions.create(model=served, prompt=PROMPT, max_tokens=4)
            tenants = await stub.ListTenants(query_pb2.ListTenantsRequest(pool="default"))
            b = next(t for t in tenants.tenants if t.allocation.tenant == "B")
            return b.tokens.completion_tokens_per_s > 0 and b.tokens.prompt_tokens_per_s > 0

        await wait_until(streaming_rate, message="B's token rate above zero")


async def test_a_cancelled_stream_counts_what_the_engine_delivered(stack: Stack) -> None:
    (gateway,) = stack.gateways
    headers = {"Authorization": f"Bearer {KEY_B}"}
    body = {"prompt": PROMPT, "max_tokens": 400, "stream": True}
    received = 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 200
        async for line in response.content:
            if line.startswith(b"data: {"):
                received += 1
            if received == 5:
                break
    # The client went away after 5 events; the gateway counts the content events that reached
    # it by then: at least those 5, and far fewer than the 400 asked for.
    tenant = gateway.state.tenants["B"]

    def counted() -> bool:
        return bool(tenant.tokens) and tenant.admission.in_flight == 0

    await wait_until(counted, message="the cut stream counted")
    (totals,) = tenant.tokens.values()
    assert 5 <= totals.completion_tokens_total < 400
    # A cut stream never got the engine's usage: its prompt is not guessed.
    assert totals.prompt_tokens_total == 0
