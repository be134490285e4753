"""Integration, real servers on port 0 and certificates made in the test: TLS and mutual TLS on
every gRPC hop (gateway and agent to the control plane) and HTTPS on the gateway.

- with mutual TLS everywhere, a gateway registers and applies its allocation, the agent's
  telemetry arrives, and the official openai client is served over HTTPS;
- the control plane refuses a client that speaks plaintext, that does not trust its CA, that
  presents no client certificate or one from another CA; an HTTPS client without the CA is
  refused by the gateway;
- grpcurl, the real binary, lists the services over TLS with `-cacert` (and `-cert`/`-key`),
  and the TLS section of docs/operations.md holds a valid config and grpcurl commands that run;
- a gateway reaches an https engine that requires its client certificate (pools[].engine_tls).
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import openai
import pytest
import yaml
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from admission_gateway.gateway import AdmissionGateway
from controlplane.agent_advisor import ChatAdvisor
from controlplane.core.snapshot import PoolSnapshot, TenantLoad
from controlplane.server import ControlPlane
from engine_sim.server import EngineSim
from slotshift.clock import SystemClock
from slotshift.config import (
    AgentPolicyConfig,
    ClientTlsConfig,
    EngineSimConfig,
    ServerTlsConfig,
    SlotshiftConfig,
    parse_config,
)
from slotshift.tls import load_channel_security, open_channel, server_ssl_context
from telemetry_agent.agent import TelemetryAgent
from telemetry_agent.engine_scraper import EngineScraper
from tests.grpcurl import grpcurl_binary
from tests.integration.stack import NoGpu
from tests.pki import TestPki, make_pki
from tests.stream_tokens import StreamTokens
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY_A = "tls-test-key-a"
MODEL = "Qwen/Qwen2.5-3B-Instruct"


@pytest.fixture
def pki(tmp_path: Path) -> TestPki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def other_pki(tmp_path: Path) -> TestPki:
    return make_pki(tmp_path / "other", name="other")


def _server_tls(pki: TestPki, *, mutual: bool) -> dict[str, Any]:
    tls: dict[str, Any] = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}
    if mutual:
        tls |= {"ca_file": str(pki.ca_cert), "require_client_cert": True}
    return tls


def _client_tls(pki: TestPki, *, ca: TestPki | None = None) -> dict[str, Any]:
    """Trusts `ca` (default: pki's CA) and presents pki's client certificate."""
    return {
        "ca_file": str((ca or pki).ca_cert),
        "cert_file": str(pki.client.cert),
        "key_file": str(pki.client.key),
    }


def _config(
    *,
    engine_url: str = "http://127.0.0.1:1",
    grpc_port: int = 0,
    controlplane_tls: dict[str, Any] | None = None,
    client_tls: dict[str, Any] | None = None,
    gateway_tls: dict[str, Any] | None = None,
) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 8,
                    "decision_period_s": 0.2,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": [KEY_A]},
                        {"name": "B", "api_keys": ["tls-test-key-b"]},
                    ],
                }
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0, "tls": controlplane_tls},
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "controlplane_tls": client_tls,
                "tls": gateway_tls,
                "report_interval_s": 0.05,
                "reconnect_initial_s": 0.05,
                "reconnect_max_s": 0.1,
            },
            "agent": {
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "controlplane_tls": client_tls,
                "engine_metrics_url": f"{engine_url}/metrics",
                "metrics_port": 0,
                "interval_s": 0.05,
                "reconnect_initial_s": 0.05,
                "reconnect_max_s": 0.1,
            },
            "engine_sim": {"port": 0},
        }
    )


@dataclass
class MutualTlsControlPlane:
    control_plane: ControlPlane
    pki: TestPki

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.control_plane.grpc_port}"


@pytest.fixture
def tokens(tmp_path: Path) -> StreamTokens:
    return StreamTokens.write(tmp_path / "stream-tokens")


@pytest.fixture
async def mutual_tls_control_plane(
    pki: TestPki, tokens: StreamTokens
) -> AsyncIterator[MutualTlsControlPlane]:
    control_plane = ControlPlane(
        tokens.apply(_config(controlplane_tls=_server_tls(pki, mutual=True)))
    )
    await control_plane.start()
    try:
        yield MutualTlsControlPlane(control_plane, pki)
    finally:
        await control_plane.stop()


def _trusting(ca_cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_cert))


async def test_mutual_tls_on_every_hop_and_https_on_the_gateway(
    pki: TestPki, tokens: StreamTokens
) -> None:
    async with AsyncExitStack() as exits:
        engine = EngineSim(_config().engine_sim)
        await engine.start()
        exits.push_async_callback(engine.stop)
        control_plane = ControlPlane(
            tokens.apply(_config(controlplane_tls=_server_tls(pki, mutual=True)))
        )
        await control_plane.start()
        exits.push_async_callback(control_plane.stop)
        config = tokens.apply(
            _config(
                engine_url=engine.url,
                grpc_port=control_plane.grpc_port,
                client_tls=_client_tls(pki),
                gateway_tls=_server_tls(pki, mutual=False),
            )
        )
        agent = TelemetryAgent(config.agent, gpu_reader=NoGpu())
        await agent.start()
        exits.push_async_callback(agent.stop)
        gateway = AdmissionGateway(config, gateway_id="gw-tls")
        await gateway.start()
        exits.push_async_callback(gateway.stop)

        state = control_plane.pools["default"]
        await wait_until(
            lambda: (
                state.gateways_connected == 1
                and gateway.state.applied_version > 0
                and state.telemetry is not None
                and agent.controlplane_connected
            ),
            message="the gateway registered and applied an allocation, telemetry arrived",
        )
        assert gateway.url.startswith("https://")

        async with openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1",
            api_key=KEY_A,
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=_trusting(pki.ca_cert)),
        ) as client:
            completion = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        assert completion.choices[0].message.content
        assert gateway.admission("A").completed_total == 1

        # The system's roots do not know the test CA: the handshake fails, nothing is served.
        async with openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key=KEY_A, max_retries=0
        ) as untrusting:
            with pytest.raises(openai.APIConnectionError):
                await untrusting.models.list()


@pytest.mark.parametrize(
    "case", ["plaintext", "without the CA", "without a client cert", "cert of another CA"]
)
async def test_the_control_plane_refuses_a_gateway_that_is_not_trusted(
    mutual_tls_control_plane: MutualTlsControlPlane, other_pki: TestPki, case: str
) -> None:
    pki = mutual_tls_control_plane.pki
    client_tls: dict[str, Any] | None = {
        "plaintext": None,
        # The right client certificate, but the server's is checked against the system's roots.
        "without the CA": {"cert_file": str(pki.client.cert), "key_file": str(pki.client.key)},
        "without a client cert": {"ca_file": str(pki.ca_cert)},
        # Trusts the right CA, presents a certificate the control plane's CA never signed.
        "cert of another CA": _client_tls(other_pki, ca=pki),
    }[case]
    config = _config(
        grpc_port=mutual_tls_control_plane.control_plane.grpc_port, client_tls=client_tls
    )
    gateway = AdmissionGateway(config, gateway_id="gw-untrusted")
    await gateway.start()
    try:
        client = gateway.control_client
        assert client is not None
        await wait_until(lambda: client.attempts >= 3, message="the gateway tried three times")
        assert not client.connected
        assert mutual_tls_control_plane.control_plane.pools["default"].gateways_connected == 0
        assert gateway.state.applied_version == 0
    finally:
        await gateway.stop()

    # The same credentials, straight: the RPC itself is refused.
    security = load_channel_security(
        None if client_tls is None else ClientTlsConfig.model_validate(client_tls)
    )
    async with open_channel(mutual_tls_control_plane.target, security) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_trusted_client_may_name_the_server_it_expects(
    mutual_tls_control_plane: MutualTlsControlPlane,
) -> None:
    pki = mutual_tls_control_plane.pki
    port = mutual_tls_control_plane.control_plane.grpc_port

    async def check(target: str, server_name: str | None) -> int:
        tls = ClientTlsConfig.model_validate(_client_tls(pki) | {"server_name": server_name})
        async with open_channel(target, load_channel_security(tls)) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        status: int = reply.status
        return status

    assert await check(f"127.0.0.1:{port}", None) == health_pb2.HealthCheckResponse.SERVING
    assert await check(f"127.0.0.1:{port}", "localhost") == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.aio.AioRpcError):
        await check(f"127.0.0.1:{port}", "controlplane.elsewhere")


async def _grpcurl(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        grpcurl_binary(),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_grpcurl_lists_the_services_over_tls(pki: TestPki, tokens: StreamTokens) -> None:
    control_plane = ControlPlane(
        tokens.apply(_config(controlplane_tls=_server_tls(pki, mutual=False)))
    )
    await control_plane.start()
    try:
        target = f"127.0.0.1:{control_plane.grpc_port}"
        code, output = await _grpcurl("-cacert", str(pki.ca_cert), target, "list")
        assert code == 0, output
        assert "slotshift.v1.AllocationService" in output.split()
        assert "grpc.health.v1.Health" in output.split()
        code, output = await _grpcurl("-plaintext", target, "list")
        assert code != 0, f"plaintext was served by a TLS control plane: {output}"
    finally:
        await control_plane.stop()


async def test_grpcurl_needs_a_client_cert_for_mutual_tls(
    mutual_tls_control_plane: MutualTlsControlPlane,
) -> None:
    pki = mutual_tls_control_plane.pki
    target = mutual_tls_control_plane.target
    code, output = await _grpcurl("-cacert", str(pki.ca_cert), target, "list")
    assert code != 0, f"listed without a client certificate: {output}"
    code, output = await _grpcurl(
        "-cacert",
        str(pki.ca_cert),
        "-cert",
        str(pki.client.cert),
        "-key",
        str(pki.client.key),
        "-d",
        '{"pool": "default"}',
        target,
        "slotshift.v1.AllocationService/GetAllocation",
    )
    assert code == 0, output
    assert '"budgetSlots": 8' in output or '"budget_slots": 8' in output


# docs/operations.md ---------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
DOC_ADDRESS = "127.0.0.1:50051"
_FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _tls_section_blocks(language: str) -> list[str]:
    section = DOC.read_text().split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    return [body for lang, body in _FENCED.findall(section) if lang == language]


def test_the_tls_config_of_the_doc_validates() -> None:
    (snippet,) = _tls_section_blocks("yaml")
    document = yaml.safe_load(snippet)
    document["pools"] = [{"name": "default", "budget_slots": 4, "tenants": [{"name": "A"}]}]
    config = parse_config(document)
    assert config.controlplane.tls is not None and config.controlplane.tls.require_client_cert
    assert config.gateway.tls is not None
    assert config.gateway.controlplane_tls is not None
    assert config.agent.controlplane_tls is not None


async def test_the_tls_grpcurl_commands_of_the_doc_run(
    mutual_tls_control_plane: MutualTlsControlPlane,
) -> None:
    pki = mutual_tls_control_plane.pki
    files = {
        "tls/ca.pem": pki.ca_cert,
        "tls/client.pem": pki.client.cert,
        "tls/client-key.pem": pki.client.key,
    }
    commands = [
        line.strip()
        for block in _tls_section_blocks("console")
        for line in block.splitlines()
        if line.strip().startswith("grpcurl ")
    ]
    assert commands, "the TLS section shows no grpcurl command"
    for command in commands:
        argv = shlex.split(command.replace(DOC_ADDRESS, mutual_tls_control_plane.target))
        argv = [str(files.get(arg, arg)) for arg in argv]
        assert all(not arg.startswith("tls/") for arg in argv), f"unknown file in {command}"
        code, output = await _grpcurl(*argv[1:])
        assert code == 0, f"{command}\n{output}"
        assert output.strip()


# the gateway's hop to the engine ---------------------------------------------------------------


@dataclass
class HttpsEngine:
    """A stand-in for vLLM served with --ssl-certfile and --ssl-cert-reqs 2 (client certs
    required): answers chat completions, noting the client certificate each came with."""

    url: str
    client_subjects: list[str]


@pytest.fixture
async def https_engine(pki: TestPki) -> AsyncIterator[HttpsEngine]:
    subjects: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        assert request.transport is not None
        peer = request.transport.get_extra_info("peercert")
        assert peer is not None, "the engine requires a client certificate"
        subjects.append(str(dict(pair[0] for pair in peer["subject"])["commonName"]))
        return web.json_response(
            {
                "id": "chatcmpl-tls",
                "object": "chat.completion",
                "created": 0,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "over TLS"},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = ServerTlsConfig.model_validate(_server_tls(pki, mutual=True))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(tls))
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield HttpsEngine(f"https://127.0.0.1:{port}", subjects)
    finally:
        await runner.cleanup()


def _with_engine_tls(engine: HttpsEngine, engine_tls: dict[str, Any]) -> SlotshiftConfig:
    document = _config().model_dump(mode="python")
    document["pools"][0] |= {"engine_url": engine.url, "engine_tls": engine_tls}
    return parse_config(document)


async def _chat_through(config: SlotshiftConfig) -> tuple[int, str]:
    gateway = AdmissionGateway(config, gateway_id="gw-engine-tls")
    await gateway.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{gateway.url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
                headers={"Authorization": f"Bearer {KEY_A}"},
            ) as response,
        ):
            body = await response.text()
        assert gateway.admission("A").in_flight == 0
        return response.status, body
    finally:
        await gateway.stop()


async def test_the_gateway_reaches_an_engine_that_requires_mutual_tls(
    pki: TestPki, https_engine: HttpsEngine
) -> None:
    status, body = await _chat_through(_with_engine_tls(https_engine, _client_tls(pki)))
    assert status == 200, body
    assert "over TLS" in body
    assert https_engine.client_subjects == ["slotshift-test client"]


async def test_the_gateway_without_a_client_cert_gets_no_answer_from_the_engine(
    pki: TestPki, https_engine: HttpsEngine
) -> None:
    status, body = await _chat_through(
        _with_engine_tls(https_engine, {"ca_file": str(pki.ca_cert)})
    )
    assert status >= 500, body
    assert https_engine.client_subjects == []


# the agent's scrape of an https engine, and the agent policy's https LLM endpoint ---------------


async def _https_site(pki: TestPki, routes: list[web.RouteDef]) -> tuple[web.AppRunner, str]:
    """An https server requiring a client certificate from pki's CA, serving `routes`."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = ServerTlsConfig.model_validate(_server_tls(pki, mutual=True))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(tls))
    await site.start()
    return runner, f"https://127.0.0.1:{runner.addresses[0][1]}"


async def test_the_agent_scrapes_an_https_engine_with_its_client_certificate(pki: TestPki) -> None:
    engine = EngineSim(EngineSimConfig(port=0))
    await engine.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{engine.url}/metrics") as response,
        ):
            exposition = await response.text()
    finally:
        await engine.stop()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=exposition, content_type="text/plain")

    runner, url = await _https_site(pki, [web.get("/metrics", metrics)])
    try:
        for tls, ok in (
            (ClientTlsConfig.model_validate(_client_tls(pki)), True),
            (ClientTlsConfig(ca_file=str(pki.ca_cert)), False),
        ):
            scraper = EngineScraper(f"{url}/metrics", timeout_s=2.0, clock=SystemClock(), tls=tls)
            await scraper.open()
            try:
                scrape = await scraper.scrape()
            finally:
                await scraper.close()
            assert (scrape.error_reason is None) is ok, scrape
    finally:
        await runner.cleanup()


async def test_the_agent_policy_asks_an_https_llm_with_its_client_certificate(
    pki: TestPki,
) -> None:
    async def chat(request: web.Request) -> web.Response:
        answer = {"limits": {"A": 6, "B": 4}, "reason": "over TLS"}
        return web.json_response(
            {"choices": [{"message": {"role": "assistant", "content": json.dumps(answer)}}]}
        )

    runner, url = await _https_site(pki, [web.post("/v1/chat/completions", chat)])
    pool = _config().pools[0]
    snapshot = PoolSnapshot(
        now_s=0.0,
        tenants={t.name: TenantLoad() for t in pool.tenants},
        current_limits={t.name: 5 for t in pool.tenants},
    )
    try:
        for tls, ok in (
            (_client_tls(pki), True),
            ({"ca_file": str(pki.ca_cert)}, False),
        ):
            settings = AgentPolicyConfig.model_validate(
                {"url": f"{url}/v1", "tls": tls, "deadline_ms": 5000}
            )
            advisor = ChatAdvisor(pool, settings)
            try:
                advice = await advisor.advise(snapshot)
            finally:
                await advisor.close()
            assert (advice.error is None) is ok, advice
            if ok:
                assert advice.limits == {"A": 6, "B": 4}
    finally:
        await runner.cleanup()
