"""Integration, real servers on port 0 in one process: what a tenant's key can and cannot do.

- no API key (valid or not, from the config or added at run time through the admin API), no
  admin token (right or wrong), not the engine's API key (which the gateway sends on every call
  to the engine) nor any other secret of the config appears in a log record (DEBUG and up,
  every logger), in a span of any service (attributes, events, links, status), in a /metrics
  scrape (the gateway's, the control plane's, the engine's) or in the pool config the admin
  API shows;
- the tenant is the key's, whatever headers or fields the client adds to claim another;
- a tenant that floods its queue cannot make another wait: the other's requests, up to its own
  limit, are admitted at once while the first is saturated.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, SecretStr

from admission_gateway.gateway import AdmissionGateway
from controlplane.server import ControlPlane
from engine_sim.server import EngineSim
from slotshift.config import PolicyName, SlotshiftConfig, parse_config
from slotshift.v1 import admin_pb2, admin_pb2_grpc
from telemetry_agent.agent import TelemetryAgent
from tests.integration.stack import NoGpu
from tests.stream_tokens import StreamTokens
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY_A = "sk-hygiene-tenant-a-3f9c2e"
KEY_B = "sk-hygiene-tenant-b-81d0aa"
KEY_A_FILE_ONLY = "sk-hygiene-tenant-a-second-77e1"
WRONG_KEY = "sk-hygiene-not-a-key-5b21c4"
AGENT_POLICY_KEY = "sk-hygiene-advisor-key-0c3d"
ADMIN_TOKEN = "admin-hygiene-token-9a7f31"
WRONG_ADMIN_TOKEN = "admin-hygiene-wrong-token-2b8e"
KEY_C = "sk-hygiene-tenant-c-added-at-runtime-64f0"
ENGINE_KEY = "sk-hygiene-engine-key-e5d917"
"""The engine's key: in files only (the gateway's engine_api_key_file, the emulator's
api_key_file), so not among the config's SecretStr values."""
MODEL = "Qwen/Qwen2.5-3B-Instruct"
BUDGET = 8


def _config(
    engine_url: str, grpc_port: int, policy: PolicyName, admin_token_file: Path, engine_key: Path
) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": BUDGET,
                    "policy": policy,
                    "decision_period_s": 0.1,
                    "engine_url": engine_url,
                    "engine_api_key_file": str(engine_key),
                    "tenants": [
                        {"name": "A", "api_keys": [KEY_A, KEY_A_FILE_ONLY]},
                        {"name": "B", "api_keys": [KEY_B]},
                    ],
                    "agent_policy": {"api_key": AGENT_POLICY_KEY},
                }
            ],
            "controlplane": {
                "grpc_port": grpc_port,
                "metrics_port": 0,
                "admin_token_file": str(admin_token_file),
            },
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "fallback_replicas": 1,
                "report_interval_s": 0.05,
                "queue_max_depth": 64,
                # A request stuck behind another tenant fails fast (503), not after a minute.
                "queue_timeout_s": 5,
            },
            "agent": {
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "engine_metrics_url": f"{engine_url}/metrics",
                "metrics_port": 0,
                "interval_s": 0.1,
            },
            "engine_sim": {"port": 0, "api_key_file": str(engine_key)},
        }
    )


def secrets_of(config: BaseModel) -> set[str]:
    """Every SecretStr value anywhere in the config (API keys, tokens), revealed."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, SecretStr):
            found.add(value.get_secret_value())
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, list | tuple | set | frozenset):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(config)
    return found


@dataclass
class Stack:
    config: SlotshiftConfig
    engine: EngineSim
    control_plane: ControlPlane
    gateway: AdmissionGateway
    spans: list[InMemorySpanExporter]


async def _start_stack(exits: AsyncExitStack, policy: PolicyName, folder: Path) -> Stack:
    exporters = []
    token_file = folder / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    engine_key = folder / "engine-api-key"
    engine_key.write_text(ENGINE_KEY + "\n")

    def provider(service: str) -> TracerProvider:
        exporter = InMemorySpanExporter()
        exporters.append(exporter)
        traced = TracerProvider(
            resource=Resource({"service.name": service}), shutdown_on_exit=False
        )
        traced.add_span_processor(SimpleSpanProcessor(exporter))
        return traced

    tokens = StreamTokens.write(folder / "stream-tokens")
    base = tokens.apply(_config("http://127.0.0.1:1", 0, policy, token_file, engine_key))
    engine = EngineSim(base.engine_sim, tracer_provider=provider("engine-sim"))
    await engine.start()
    exits.push_async_callback(engine.stop)
    control_plane = ControlPlane(base, tracer_provider=provider("controlplane"))
    await control_plane.start()
    exits.push_async_callback(control_plane.stop)
    config = tokens.apply(
        _config(engine.url, control_plane.grpc_port, policy, token_file, engine_key)
    )
    agent = TelemetryAgent(config.agent, gpu_reader=NoGpu(), tracer_provider=provider("agent"))
    await agent.start()
    exits.push_async_callback(agent.stop)
    gateway = AdmissionGateway(config, gateway_id="gw-0", tracer_provider=provider("gateway"))
    await gateway.start()
    exits.push_async_callback(gateway.stop)
    state = control_plane.pools["default"]
    await wait_until(
        lambda: (
            state.gateways_connected == 1
            and gateway.state.applied_version > 0
            and state.telemetry is not None
        ),
        message="gateway and agent connected, an allocation applied",
    )
    return Stack(config, engine, control_plane, gateway, exporters)


@pytest.fixture
async def stack(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> AsyncIterator[Stack]:
    caplog.set_level(logging.DEBUG)
    async with AsyncExitStack() as exits:
        yield await _start_stack(exits, "demand", tmp_path)


@pytest.fixture
async def static_stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield await _start_stack(exits, "static", tmp_path)


async def _add_tenant_c(stack: Stack, token: str) -> grpc.StatusCode:
    """AdminService.AddTenant of a tenant C with KEY_C, authorised by `token`."""
    request = admin_pb2.AddTenantRequest(pool="default", tenant="C", api_keys=[KEY_C])
    target = f"127.0.0.1:{stack.control_plane.grpc_port}"
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            await admin_pb2_grpc.AdminServiceStub(channel).AddTenant(
                request, metadata=[("authorization", f"Bearer {token}")], timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def _pool_config_text(stack: Stack) -> str:
    target = f"127.0.0.1:{stack.control_plane.grpc_port}"
    async with grpc.aio.insecure_channel(target) as channel:
        view = await admin_pb2_grpc.AdminServiceStub(channel).GetPoolConfig(
            admin_pb2.GetPoolConfigRequest(pool="default"), timeout=5
        )
    return str(view)


def _span_text(span: ReadableSpan) -> str:
    """Everything a span exports: name, attributes, events, links, status, resource."""
    text: str = span.to_json()
    return text


async def _call(
    session: aiohttp.ClientSession,
    url: str,
    *,
    authorization: str | None,
    payload: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> int:
    sent = dict(headers or {})
    if authorization is not None:
        sent["Authorization"] = authorization
    if payload is None:
        async with session.get(url, headers=sent) as response:
            await response.read()
            return response.status
    async with session.post(url, json=payload, headers=sent) as response:
        await response.read()
        return response.status


async def test_no_key_or_secret_is_logged_traced_or_exported(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    secrets = secrets_of(stack.config) | {
        WRONG_KEY,
        ADMIN_TOKEN,
        WRONG_ADMIN_TOKEN,
        KEY_C,
        ENGINE_KEY,
    }
    assert {KEY_A, KEY_B, KEY_A_FILE_ONLY, AGENT_POLICY_KEY} <= secrets
    # A tenant added at run time: its key travels to the gateways (as a digest) and is used.
    assert await _add_tenant_c(stack, WRONG_ADMIN_TOKEN) == grpc.StatusCode.UNAUTHENTICATED
    assert await _add_tenant_c(stack, ADMIN_TOKEN) == grpc.StatusCode.OK
    await wait_until(
        lambda: "C" in stack.gateway.state.tenants and stack.gateway.admission("C").limit_slots > 0,
        message="the gateway admits C",
    )
    base = stack.gateway.url
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    completion = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.gather(
            _call(session, f"{base}/v1/chat/completions", authorization=f"Bearer {KEY_A}",
                  payload=chat),
            _call(session, f"{base}/v1/completions", authorization=f"Bearer {KEY_B}",
                  payload=completion),
            _call(session, f"{base}/v1/models", authorization=f"Bearer {KEY_A_FILE_ONLY}"),
            _call(session, f"{base}/v1/chat/completions", authorization=f"Bearer {WRONG_KEY}",
                  payload=chat),
            # A key in the wrong scheme or with junk around it is refused without being echoed.
            _call(session, f"{base}/v1/chat/completions", authorization=f"Basic {KEY_A}",
                  payload=chat),
            _call(session, f"{base}/v1/chat/completions",
                  authorization=f"Bearer {KEY_A} {WRONG_KEY}", payload=chat),
            _call(session, f"{base}/v1/chat/completions", authorization=None, payload=chat),
            _call(session, f"{base}/v1/chat/completions", authorization=f"Bearer {KEY_C}",
                  payload=chat),
        )  # fmt: skip
        assert statuses == [200, 200, 200, 401, 401, 401, 401, 200]
        async with session.get(f"{base}/metrics") as response:
            gateway_metrics = await response.text()
        metrics_url = f"http://127.0.0.1:{stack.control_plane.metrics_port}/metrics"
        async with session.get(metrics_url) as response:
            controlplane_metrics = await response.text()
        async with session.get(f"{stack.engine.url}/metrics") as response:
            engine_metrics = await response.text()
        # The engine needs its key, which the gateways sent on each request above.
        engine_chat = f"{stack.engine.url}/v1/chat/completions"
        assert await _call(session, engine_chat, authorization=None, payload=chat) == 401
        assert (
            await _call(session, engine_chat, authorization=f"Bearer {KEY_A}", payload=chat) == 401
        )
    pool_config = await _pool_config_text(stack)
    # Let the decisions that saw the requests finish and export their spans.
    version = stack.gateway.state.applied_version
    await wait_until(
        lambda: any(s.name == "decision" for e in stack.spans for s in e.get_finished_spans()),
        message="a decision was traced",
    )

    spans = [s for exporter in stack.spans for s in exporter.get_finished_spans()]
    assert {s.name for s in spans} >= {"decision", "POST /v1/chat/completions", "llm_request"}
    assert version > 0
    # The stack starts in the fixture: its records (connections, allocations) are the setup's.
    records = caplog.get_records("setup") + caplog.records
    assert any(r.name.startswith("admission_gateway") for r in records), "capture is not working"
    formatter = logging.Formatter("%(name)s %(message)s")
    logged = "\n".join(formatter.format(record) for record in records)
    for secret in secrets:
        for span in spans:
            assert secret not in _span_text(span), f"a key in span {span.name}"
        assert secret not in logged, "a key was logged"
        assert secret not in gateway_metrics
        assert secret not in controlplane_metrics
        assert secret not in engine_metrics
        assert secret not in pool_config


async def test_the_tenant_comes_from_the_key_not_from_headers(stack: Stack) -> None:
    claims = {
        "X-Tenant": "B",
        "X-Slotshift-Tenant": "B",
        "OpenAI-Organization": "B",
        "OpenAI-Project": "B",
        "X-Forwarded-User": "B",
    }
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "user": "B",
    }
    async with aiohttp.ClientSession() as session:
        status = await _call(
            session,
            f"{stack.gateway.url}/v1/chat/completions",
            authorization=f"Bearer {KEY_A}",
            payload=payload,
            headers=claims,
        )
        assert status == 200
        # B's name where the key should be is no key at all.
        refused = await _call(
            session,
            f"{stack.gateway.url}/v1/chat/completions",
            authorization="Bearer B",
            payload=payload,
            headers=claims,
        )
        assert refused == 401
    assert stack.gateway.admission("A").completed_total == 1
    assert stack.gateway.admission("B").admitted_total == 0
    request_spans = [
        s
        for e in stack.spans
        for s in e.get_finished_spans()
        if s.name == "POST /v1/chat/completions" and s.attributes is not None
    ]
    assert [s.attributes.get("slotshift.tenant") for s in request_spans if s.attributes] == [
        "A",
        None,
    ]


async def test_a_flooding_tenant_cannot_take_another_tenants_slots(static_stack: Stack) -> None:
    gateway = static_stack.gateway
    a, b = gateway.admission("A"), gateway.admission("B")
    # The static policy keeps each tenant at its nominal half of the budget.
    await wait_until(lambda: a.limit_slots == b.limit_slots == BUDGET // 2, message="4/4")
    url = f"{gateway.url}/v1/completions"
    long_request = {"model": MODEL, "prompt": "Hi", "max_tokens": 30_000, "ignore_eos": True}
    short_request = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}
    flood_size = 5 * a.limit_slots
    async with aiohttp.ClientSession() as session:
        flood = [
            asyncio.create_task(
                _call(session, url, authorization=f"Bearer {KEY_A}", payload=long_request)
            )
            for _ in range(flood_size)
        ]
        try:
            await wait_until(
                lambda: a.in_flight == a.limit_slots and a.queued == flood_size - a.limit_slots,
                message="A saturated: its limit running, the rest queued",
            )
            # B sends as many as its own limit while A stays saturated: none of them waits.
            statuses = await asyncio.gather(
                *(
                    _call(session, url, authorization=f"Bearer {KEY_B}", payload=short_request)
                    for _ in range(b.limit_slots)
                )
            )
            assert statuses == [200] * b.limit_slots
            waits = b.queue_wait.percentiles()
            assert waits.count == b.limit_slots
            # Admitted at once waits microseconds; behind A it would wait for A's endless flood.
            assert waits.p99_ms < 10.0, "B waited behind A"
            assert a.in_flight == a.limit_slots, "A grew beyond its limit"
            assert a.queued == flood_size - a.limit_slots
            assert a.admitted_total == a.limit_slots
        finally:
            for task in flood:
                task.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
    await wait_until(lambda: a.in_flight == 0 and a.queued == 0, message="A's flood released")
