"""Integration, real servers on port 0: who may open the control plane's streams.

A rogue peer without credentials gets UNAUTHENTICATED, one with the other role's token (or a
valid client certificate of the wrong role, or of another pool) PERMISSION_DENIED; either is
refused before anything is sent to it (no tenant directory, no allocation) while real gateways
run under load, and nothing it says reaches the pool's state (no gateway registered, no
telemetry kept). A control plane with no stream credentials does not start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from controlplane.server import ControlPlane
from slotshift.config import ClientTlsConfig, ConfigError, SlotshiftConfig, parse_config
from slotshift.tls import load_channel_security, open_channel
from slotshift.v1 import (
    common_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    telemetry_pb2,
    telemetry_pb2_grpc,
)
from tests.integration.stack import Stack, start_stack
from tests.pki import TestPki, make_pki
from tests.stream_tokens import StreamTokens
from tests.support import wait_until

BUDGET = 16
ROGUE_ID = "rogue-gw"
Metadata = tuple[tuple[str, str], ...]


def _config(engine_url: str, grpc_port: int) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": BUDGET,
                    "policy": "demand",
                    "decision_period_s": 0.1,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                        {"name": "B", "api_keys": ["key-b"], "floor_slots": 2},
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
            "engine_sim": {"port": 0},
        }
    )


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield await start_stack(exits, _config, gateways=2)


def _greedy_hello(pool: str, gateway_id: str = ROGUE_ID) -> gateway_pb2.GatewayMessage:
    """A hello that, were it taken, would register a gateway holding the whole budget."""
    return gateway_pb2.GatewayMessage(
        hello=gateway_pb2.GatewayHello(
            pool=pool,
            gateway_id=gateway_id,
            applied_version=1_000_000,
            tenants=[
                common_pb2.TenantDemand(tenant="A", in_flight=BUDGET, limit_slots=BUDGET),
                common_pb2.TenantDemand(tenant="B", in_flight=BUDGET, limit_slots=BUDGET),
            ],
        )
    )


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    received: list[gateway_pb2.ControlMessage]


async def _connect(
    channel: grpc.aio.Channel, metadata: Metadata, hello: gateway_pb2.GatewayMessage
) -> Outcome:
    """One Connect call that says hello and then waits; what came back and how it ended."""
    hold = asyncio.Event()

    async def messages() -> AsyncIterator[gateway_pb2.GatewayMessage]:
        yield hello
        # Hold the stream open: an admitted peer would now get its directory and allocation.
        await hold.wait()

    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    call = stub.Connect(messages(), metadata=metadata, timeout=1.5)
    received: list[gateway_pb2.ControlMessage] = []
    try:
        async for message in call:
            received.append(message)
    except grpc.aio.AioRpcError as exc:
        return Outcome(exc.code(), exc.details() or "", received)
    finally:
        hold.set()
    return Outcome(await call.code(), await call.details(), received)


async def _stream_telemetry(
    channel: grpc.aio.Channel, metadata: Metadata, pools: Iterable[str], agent_id: str
) -> tuple[grpc.StatusCode, int]:
    stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)

    async def reports() -> AsyncIterator[telemetry_pb2.TelemetryReport]:
        for pool in pools:
            yield telemetry_pb2.TelemetryReport(
                pool=pool,
                agent_id=agent_id,
                gpu_source=telemetry_pb2.GPU_SOURCE_EMULATED,
                gpus=[telemetry_pb2.GpuSample(index=0, utilization_pct=99.0)],
                engine=telemetry_pb2.EngineSample(scrape_ok=True, kv_cache_usage_perc=1.0),
            )

    try:
        summary = await stub.StreamTelemetry(reports(), metadata=metadata, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), 0
    return grpc.StatusCode.OK, summary.reports_received


def _bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


def _tokens_of(config: SlotshiftConfig) -> tuple[str, str]:
    auth = config.controlplane.stream_auth
    assert auth.gateway_token_file is not None and auth.agent_token_file is not None
    return (
        Path(auth.gateway_token_file).read_text().strip(),
        Path(auth.agent_token_file).read_text().strip(),
    )


def _rejections(control_plane: ControlPlane, role: str, code: str) -> float:
    value = control_plane.metrics.registry.get_sample_value(
        "slotshift_controlplane_stream_rejections_total", {"role": role, "code": code}
    )
    return value or 0.0


async def _closed_loop(session: aiohttp.ClientSession, url: str, key: str, until: float) -> int:
    done = 0
    payload = {"model": "Qwen/Qwen2.5-3B-Instruct", "prompt": "hi", "max_tokens": 8}
    while time.monotonic() < until:
        async with session.post(
            f"{url}/v1/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            await response.read()
            assert response.status == 200, await response.text()
            done += 1
    return done


async def test_rogue_peers_are_refused_under_load_and_change_nothing(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane.service.stream_guard")
    control_plane = stack.control_plane
    state = control_plane.pools["default"]
    real = {g.gateway_id for g in stack.gateways}
    await wait_until(
        lambda: (
            state.gateways_connected == 2
            and all(g.state.applied_version > 0 for g in stack.gateways)
        ),
        message="the real gateways connected and applied an allocation",
    )
    sessions_before = [
        g.control_client.sessions_started for g in stack.gateways if g.control_client
    ]
    gateway_token, agent_token = _tokens_of(stack.config)
    target = f"127.0.0.1:{control_plane.grpc_port}"
    seen_gateways: set[str] = set()
    stop = asyncio.Event()

    async def watch() -> None:
        # Every allocation published meanwhile, and every gateway the registry holds.
        while not stop.is_set():
            seen_gateways.update(state.allocation.gateways)
            seen_gateways.update(state.applied_versions())
            await asyncio.sleep(0.005)

    attempts = 5
    until = time.monotonic() + 2.5
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        grpc.aio.insecure_channel(target) as channel,
    ):
        watcher = asyncio.create_task(watch(), name="watch-allocations")
        load = [
            asyncio.create_task(
                _closed_loop(session, g.url, key, until), name=f"load/{g.gateway_id}/{key}"
            )
            for g in stack.gateways
            for key in ("key-a", "key-b")
            for _ in range(6)
        ]
        await asyncio.sleep(0.3)  # the load is on
        outcomes = {
            "no token": [
                await _connect(channel, (), _greedy_hello("default")) for _ in range(attempts)
            ],
            "wrong token": [
                await _connect(channel, _bearer("guessed"), _greedy_hello("default"))
                for _ in range(attempts)
            ],
            "agent token": [
                await _connect(channel, _bearer(agent_token), _greedy_hello("default"))
                for _ in range(attempts)
            ],
        }
        telemetry = {
            "no token": await _stream_telemetry(channel, (), ["default"], "rogue-agent"),
            "gateway token": await _stream_telemetry(
                channel, _bearer(gateway_token), ["default"], "rogue-agent"
            ),
        }
        done = sum(await asyncio.gather(*load))
        stop.set()
        await watcher

    for case, expected in (
        ("no token", grpc.StatusCode.UNAUTHENTICATED),
        ("wrong token", grpc.StatusCode.UNAUTHENTICATED),
        ("agent token", grpc.StatusCode.PERMISSION_DENIED),
    ):
        for outcome in outcomes[case]:
            assert outcome.code == expected, (case, outcome)
            assert outcome.received == [], f"{case}: the rogue was sent {outcome.received}"
            assert gateway_token not in outcome.details and agent_token not in outcome.details
    assert telemetry["no token"] == (grpc.StatusCode.UNAUTHENTICATED, 0)
    assert telemetry["gateway token"] == (grpc.StatusCode.PERMISSION_DENIED, 0)

    assert done > 20, "the load did not run"
    assert seen_gateways == real, f"a rogue reached the allocations: {seen_gateways - real}"
    assert state.telemetry is None or state.telemetry.agent_id != "rogue-agent"
    allocation = state.allocation
    assert sum(allocation.tenant_limits.values()) == BUDGET
    assert set(allocation.gateways) == real
    # The real gateways' streams were never disturbed.
    assert [g.control_client.sessions_started for g in stack.gateways if g.control_client] == (
        sessions_before
    )
    assert _rejections(control_plane, "gateway", "UNAUTHENTICATED") == 2 * attempts
    assert _rejections(control_plane, "gateway", "PERMISSION_DENIED") == attempts
    assert _rejections(control_plane, "agent", "UNAUTHENTICATED") == 1
    assert _rejections(control_plane, "agent", "PERMISSION_DENIED") == 1
    # Once per peer and reason, whatever the attempts; never a token.
    refusals = [r.getMessage() for r in caplog.records if "stream from" in r.getMessage()]
    assert len(refusals) == 5, refusals
    assert not any(gateway_token in line or agent_token in line for line in refusals)


async def test_a_rotated_token_file_admits_the_old_and_the_new_token(tmp_path: Path) -> None:
    tokens = StreamTokens.write(tmp_path / "tokens")
    tokens.gateway_file.write_text(f"# rotation\nnew-gateway-token\n{tokens.gateway_token}\n")
    config = tokens.apply(_config("http://127.0.0.1:1", 0))
    control_plane = ControlPlane(config)
    await control_plane.start()
    try:
        target = f"127.0.0.1:{control_plane.grpc_port}"
        async with grpc.aio.insecure_channel(target) as channel:
            for token in ("new-gateway-token", tokens.gateway_token):
                outcome = await _connect(channel, _bearer(token), _greedy_hello("default", "gw"))
                assert outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED  # served, held open
                assert outcome.received, f"{token}: admitted but sent nothing"
            refused = await _connect(channel, _bearer("# rotation"), _greedy_hello("default"))
            assert refused.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await control_plane.stop()


async def test_a_control_plane_without_stream_credentials_does_not_start() -> None:
    config = _config("http://127.0.0.1:1", 0)
    with pytest.raises(ConfigError, match="no credentials for the gateway and agent streams"):
        await ControlPlane(config).start()
    insecure = parse_config(
        {
            **config.model_dump(mode="json", exclude={"pools"}),
            "pools": [{"name": "default", "budget_slots": 4, "tenants": [{"name": "A"}]}],
            "controlplane": {
                "grpc_port": 0,
                "metrics_port": 0,
                "stream_auth": {"insecure_allow_unauthenticated": True},
            },
        }
    )
    control_plane = ControlPlane(insecure)
    await control_plane.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.grpc_port}") as channel:
            code, received = await _stream_telemetry(channel, (), ["default"], "agent")
        assert (code, received) == (grpc.StatusCode.OK, 1)
    finally:
        await control_plane.stop()


# mutual TLS: identities on an allow-list, per role and pool ------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> TestPki:
    return make_pki(tmp_path / "pki", clients=("gw-a", "agent-a", "stranger"))


@pytest.fixture
async def identity_control_plane(pki: TestPki) -> AsyncIterator[ControlPlane]:
    """Two pools; the gateways' and the agents' certificates each allowed for pool a only; no
    tokens: the certificate's identity alone authenticates."""
    document: dict[str, Any] = {
        "pools": [
            {"name": name, "budget_slots": 4, "tenants": [{"name": f"tenant-{name}"}]}
            for name in ("a", "b")
        ],
        "controlplane": {
            "grpc_port": 0,
            "metrics_port": 0,
            "tls": {
                "cert_file": str(pki.server.cert),
                "key_file": str(pki.server.key),
                "ca_file": str(pki.ca_cert),
                "require_client_cert": True,
            },
            "stream_auth": {
                "gateway_identities": [{"name": "gw-a", "pools": ["a"]}],
                "agent_identities": [{"name": "agent-a", "pools": ["a"]}],
            },
        },
    }
    control_plane = ControlPlane(parse_config(document))
    await control_plane.start()
    try:
        yield control_plane
    finally:
        await control_plane.stop()


def _channel_as(pki: TestPki, client: str, port: int) -> grpc.aio.Channel:
    pair = pki.clients[client]
    tls = {"ca_file": str(pki.ca_cert), "cert_file": str(pair.cert), "key_file": str(pair.key)}
    return open_channel(
        f"127.0.0.1:{port}", load_channel_security(ClientTlsConfig.model_validate(tls))
    )


@pytest.mark.parametrize(
    ("client", "pool", "expected"),
    [
        pytest.param("gw-a", "a", grpc.StatusCode.DEADLINE_EXCEEDED, id="its pool: served"),
        pytest.param("gw-a", "b", grpc.StatusCode.PERMISSION_DENIED, id="another pool"),
        pytest.param("agent-a", "a", grpc.StatusCode.PERMISSION_DENIED, id="an agent's cert"),
        pytest.param("stranger", "a", grpc.StatusCode.PERMISSION_DENIED, id="unlisted cert"),
    ],
)
async def test_a_gateway_certificate_serves_only_the_pools_it_is_listed_for(
    identity_control_plane: ControlPlane, pki: TestPki, client: str, pool: str, expected: Any
) -> None:
    async with _channel_as(pki, client, identity_control_plane.grpc_port) as channel:
        outcome = await _connect(channel, (), _greedy_hello(pool, f"gw-{client}"))
    assert outcome.code == expected, outcome
    state = identity_control_plane.pools[pool]
    if expected == grpc.StatusCode.DEADLINE_EXCEEDED:
        assert [m.WhichOneof("kind") for m in outcome.received][:1] == ["tenants"]
        return
    assert outcome.received == []
    assert f"gw-{client}" not in state.applied_versions()
    assert f"gw-{client}" not in state.allocation.gateways


@pytest.mark.parametrize(
    ("client", "pools", "expected", "received"),
    [
        pytest.param("agent-a", ["a"], grpc.StatusCode.OK, 1, id="its pool"),
        pytest.param("agent-a", ["b"], grpc.StatusCode.PERMISSION_DENIED, 0, id="another pool"),
        pytest.param("agent-a", ["a", "b"], grpc.StatusCode.PERMISSION_DENIED, 0, id="then b"),
        pytest.param("gw-a", ["a"], grpc.StatusCode.PERMISSION_DENIED, 0, id="a gateway cert"),
        pytest.param("stranger", ["a"], grpc.StatusCode.PERMISSION_DENIED, 0, id="unlisted"),
    ],
)
async def test_an_agent_certificate_reports_only_for_the_pools_it_is_listed_for(
    identity_control_plane: ControlPlane,
    pki: TestPki,
    client: str,
    pools: list[str],
    expected: Any,
    received: int,
) -> None:
    async with _channel_as(pki, client, identity_control_plane.grpc_port) as channel:
        outcome = await _stream_telemetry(channel, (), pools, f"agent-{client}")
    assert outcome == (expected, received)
    assert identity_control_plane.pools["b"].telemetry is None
    if expected != grpc.StatusCode.OK and pools == ["a"]:
        assert identity_control_plane.pools["a"].telemetry is None


def test_identities_need_mutual_tls() -> None:
    with pytest.raises(ConfigError, match="need tls with require_client_cert"):
        parse_config(
            {
                "pools": [{"name": "a", "budget_slots": 4, "tenants": [{"name": "A"}]}],
                "controlplane": {
                    "stream_auth": {"gateway_identities": [{"name": "gw", "pools": "all"}]}
                },
            }
        )
