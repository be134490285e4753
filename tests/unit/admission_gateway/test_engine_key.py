"""The engine's API key: the gateway sends its pool's key (pools[].engine_api_key_file) on every
call to the engine, and the client's own Authorization never; an engine's 401 is the gateway's
misconfiguration (502), not the client's answer."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from multidict import CIMultiDict
from opentelemetry import trace
from pydantic import SecretStr

from admission_gateway.gateway import AdmissionGateway
from admission_gateway.preemptible import PreemptibleRelay
from admission_gateway.upstream import EngineClient, EngineCredentialsRefused
from slotshift.config import ConfigError, SlotshiftConfig
from tests.unit.admission_gateway.conftest import KEYS, StartGateway, auth, make_config
from tests.unit.admission_gateway.fake_engine import FakeEngine

ENGINE_KEY = "sk-engine-only-the-gateways-hold-4d1e"
CHAT = {"model": "fake", "user": "A", "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": "fake", "user": "A", "prompt": "Hi"}
TIMEOUT_S = 10.0
TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"

StartKeyed = Callable[[str, Path], Awaitable[AdmissionGateway]]


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "engine-api-key"
    # A mounted Secret may start with a comment and end in a newline.
    path.write_text(f"# the engine's key\n{ENGINE_KEY}\n")
    return path


@pytest_asyncio.fixture
async def start_keyed() -> AsyncIterator[StartKeyed]:
    """Start a gateway whose pool (in front of `engine_url`) has `key_file` as its
    engine_api_key_file; stopped after the test."""
    started: list[AdmissionGateway] = []

    async def start(engine_url: str, key_file: Path) -> AdmissionGateway:
        gateway = AdmissionGateway(keyed_config(engine_url, key_file), gateway_id="gw-key")
        await gateway.start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        await gateway.stop()


@pytest_asyncio.fixture
async def refusing_engine() -> AsyncIterator[str]:
    """The URL of an engine that answers every API call as vLLM does a request without its
    key."""

    async def refuse(_: web.Request) -> web.Response:
        return web.Response(
            status=401, body=b'{"error":"Unauthorized"}', content_type="application/json"
        )

    app = web.Application()
    app.add_routes([web.post("/v1/completions", refuse), web.get("/v1/models", refuse)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def keyed_config(engine_url: str, key_file: Path) -> SlotshiftConfig:
    config = make_config(engine_url)
    pool = config.pools[0].model_copy(update={"engine_api_key_file": str(key_file)})
    return config.model_copy(update={"pools": [pool]})


def authorizations(engine: FakeEngine) -> list[str | None]:
    """The Authorization each request the engine got carried (None: none)."""
    return [
        next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        for headers in engine.headers_seen
    ]


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any | None = None
) -> tuple[int, bytes]:
    async with http.request(method, url, json=body, headers=auth("A")) as response:
        return response.status, await response.read()


async def test_every_relayed_call_carries_the_engines_key_and_never_the_clients(
    start_keyed: StartKeyed, engine: FakeEngine, http: aiohttp.ClientSession, key_file: Path
) -> None:
    gateway = await start_keyed(engine.url, key_file)
    url = gateway.url
    statuses = [
        (await call(http, "POST", url + "/v1/completions", COMPLETION))[0],
        (await call(http, "POST", url + "/v1/chat/completions", CHAT))[0],
        (await call(http, "POST", url + "/v1/completions", {**COMPLETION, "stream": True}))[0],
        # One pool naming no models: /v1/models is the engine's own answer.
        (await call(http, "GET", url + "/v1/models"))[0],
    ]
    assert statuses == [200, 200, 200, 200]
    assert authorizations(engine) == [f"Bearer {ENGINE_KEY}"] * 4
    assert all(KEYS["A"] not in json.dumps(headers) for headers in engine.headers_seen)


async def test_without_an_engine_key_no_authorization_reaches_the_engine(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    assert (await call(http, "POST", gateway.url + "/v1/completions", COMPLETION))[0] == 200
    assert (await call(http, "GET", gateway.url + "/v1/models"))[0] == 200
    assert authorizations(engine) == [None, None]


@pytest.mark.parametrize(
    "api_key",
    [pytest.param(SecretStr(ENGINE_KEY), id="with-key"), pytest.param(None, id="without-key")],
)
async def test_send_replaces_whatever_authorization_the_caller_passes(
    engine: FakeEngine, api_key: SecretStr | None
) -> None:
    async with EngineClient(engine_ssl=True, keepalive_timeout_s=60, api_key=api_key) as client:
        headers = CIMultiDict([("Authorization", "Bearer client"), ("authorization", "Basic x")])
        headers["Content-Type"] = "application/json"
        response = await client.send(
            "POST",
            engine.url + "/v1/completions",
            data=json.dumps(COMPLETION).encode(),
            headers=headers,
            timeout_s=TIMEOUT_S,
        )
        assert response.status == 200
        response.release()
    expected = None if api_key is None else f"Bearer {ENGINE_KEY}"
    assert authorizations(engine) == [expected]
    assert [k for k in engine.headers_seen[0] if k.lower() == "authorization"] == (
        [] if api_key is None else ["Authorization"]
    )


async def test_the_tokenize_call_of_a_resumable_prompt_carries_the_engines_key(
    engine: FakeEngine,
) -> None:
    async with EngineClient(
        engine_ssl=True, keepalive_timeout_s=60, api_key=SecretStr(ENGINE_KEY)
    ) as client:
        relay = PreemptibleRelay(
            engine=client,
            engine_url=engine.url,
            upstream_timeout_s=10,
            paused_keepalive_interval_s=5,
            tracer=trace.NoOpTracer(),
        )
        ids = await relay.tokenized_prompt(
            "/v1/completions",
            {"model": "fake", "prompt": "Hi"},
            CIMultiDict({"Authorization": "Bearer client", "traceparent": TRACEPARENT}),
        )
    assert ids == [ord("H"), ord("i")]
    assert authorizations(engine) == [f"Bearer {ENGINE_KEY}"]


async def test_an_engine_that_refuses_the_key_fails_the_request_with_502_and_says_why(
    start_keyed: StartKeyed,
    refusing_engine: str,
    http: aiohttp.ClientSession,
    key_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = await start_keyed(refusing_engine, key_file)
    status, body = await call(http, "POST", gateway.url + "/v1/completions", COMPLETION)
    models_status, _ = await call(http, "GET", gateway.url + "/v1/models")
    # Not the engine's 401: the client's key was good, the gateway's own was refused.
    assert (status, models_status) == (502, 502)
    assert json.loads(body)["error"]["code"] == "upstream_unavailable"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "is not one it takes (pools[].engine_api_key_file)" in logged
    assert ENGINE_KEY not in logged


async def test_send_says_an_engine_requires_a_key_when_none_was_set(refusing_engine: str) -> None:
    async with EngineClient(engine_ssl=True, keepalive_timeout_s=60) as client:
        with pytest.raises(EngineCredentialsRefused, match="it requires an API key"):
            await client.send(
                "GET",
                refusing_engine + "/v1/models",
                data=None,
                headers={},
                timeout_s=TIMEOUT_S,
            )


@pytest.mark.parametrize(
    "content", [pytest.param("", id="empty"), pytest.param("# only a comment\n\n", id="comment")]
)
async def test_a_gateway_whose_engine_key_file_holds_no_key_does_not_start(
    engine: FakeEngine, tmp_path: Path, content: str
) -> None:
    path = tmp_path / "engine-api-key"
    path.write_text(content)
    gateway = AdmissionGateway(keyed_config(engine.url, path), gateway_id="gw-bad")
    with pytest.raises(ConfigError, match=r"pool p: engine_api_key_file: .* holds no token"):
        await gateway.start()


async def test_a_gateway_whose_engine_key_file_is_missing_does_not_start(
    engine: FakeEngine, tmp_path: Path
) -> None:
    config = keyed_config(engine.url, tmp_path / "no-such-file")
    gateway = AdmissionGateway(config, gateway_id="gw-bad")
    with pytest.raises(ConfigError, match="engine_api_key_file: cannot read"):
        await gateway.start()
