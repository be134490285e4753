"""The HTTP proxy on port 0 in front of a fake engine: relay, limits, errors, metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from admission_gateway import proxy as proxy_module
from admission_gateway.gateway import AdmissionGateway
from admission_gateway.gateway_state import TenantLimit
from tests.support import free_port, wait_until
from tests.unit.admission_gateway.conftest import StartGateway, auth
from tests.unit.admission_gateway.fake_engine import FakeEngine

CHAT = {"model": "fake", "user": "A", "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": "fake", "user": "A", "prompt": "Hi"}


def set_limits(gateway: AdmissionGateway, version: int, **limits: int) -> None:
    """Apply an allocation as the control plane would (tenants not named get 0)."""
    applied = gateway.state.apply_allocation(
        version, [TenantLimit(tenant, limit, limit) for tenant, limit in limits.items()]
    )
    assert applied


async def post(
    http: aiohttp.ClientSession,
    gateway: AdmissionGateway,
    path: str,
    body: Any,
    *,
    tenant: str = "A",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, CIMultiDictProxy[str]]:
    async with http.post(
        gateway.url + path, json=body, headers={**auth(tenant), **(headers or {})}
    ) as response:
        return response.status, await response.json(), response.headers


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        pytest.param("/v1/chat/completions", CHAT, "message", id="chat"),
        pytest.param("/v1/completions", COMPLETION, "text", id="completions"),
    ],
)
async def test_a_non_streamed_request_is_passed_through(
    start_gateway: StartGateway,
    engine: FakeEngine,
    http: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    gateway = await start_gateway()
    status, payload, _ = await post(http, gateway, path, body)
    assert status == 200
    assert field in payload["choices"][0]
    tenant = gateway.state.tenants["A"]
    assert (tenant.admission.admitted_total, tenant.admission.in_flight) == (1, 0)
    assert (len(tenant.e2e), len(tenant.ttft)) == (1, 0)
    assert engine.served["A"] == 1


async def test_a_stream_is_relayed_chunk_by_chunk_as_it_arrives(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    engine.gate = asyncio.Event()
    async with http.post(
        gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth("A")
    ) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        # The engine holds back everything after its first event: that event must get through.
        first = await asyncio.wait_for(response.content.readline(), timeout=5)
        assert b'"role": "assistant"' in first
        assert gateway.admission("A").in_flight == 1
        engine.gate.set()
        rest = await response.read()
    assert rest.rstrip().endswith(b"data: [DONE]")
    contents = [
        json.loads(line[6:])["choices"][0]["delta"].get("content", "")
        for line in (first + rest).splitlines()
        if line.startswith(b"data: {")
    ]
    assert "".join(contents) == "Hello, world"
    tenant = gateway.state.tenants["A"]
    await wait_until(lambda: tenant.admission.in_flight == 0)
    assert (len(tenant.ttft), len(tenant.e2e)) == (1, 1)
    assert tenant.ttft.percentiles().p50_ms <= tenant.e2e.percentiles().p50_ms


async def test_the_limit_holds_under_parallel_load(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    set_limits(gateway, 1, A=3, B=2)
    engine.gate = asyncio.Event()

    async def call(tenant: str) -> int:
        status, _, _ = await post(
            http, gateway, "/v1/completions", {**COMPLETION, "user": tenant}, tenant=tenant
        )
        return status

    calls = [asyncio.create_task(call("A")) for _ in range(10)]
    calls += [asyncio.create_task(call("B")) for _ in range(3)]
    a, b = gateway.admission("A"), gateway.admission("B")
    await wait_until(lambda: (a.in_flight, a.queued, b.in_flight, b.queued) == (3, 7, 2, 1))
    await wait_until(lambda: engine.in_flight == {"A": 3, "B": 2}, message="admitted reach engine")
    engine.gate.set()
    assert await asyncio.gather(*calls) == [200] * 13
    assert engine.peak_in_flight == {"A": 3, "B": 2}
    assert (a.in_flight, a.queued, a.admitted_total, a.completed_total) == (0, 0, 10, 10)


async def test_a_client_leaving_mid_stream_aborts_upstream_and_frees_the_slot(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    engine.gate = asyncio.Event()
    response = await http.post(
        gateway.url + "/v1/completions", json={**COMPLETION, "stream": True}, headers=auth("A")
    )
    await response.content.readline()
    assert gateway.admission("A").in_flight == 1
    response.close()
    await wait_until(lambda: gateway.admission("A").in_flight == 0, message="slot released")
    await wait_until(lambda: engine.aborted == 1, message="upstream aborted")
    assert gateway.admission("A").completed_total == 1


async def test_a_client_leaving_while_queued_leaves_the_queue(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    set_limits(gateway, 1, A=0, B=1)
    waiting = asyncio.create_task(post(http, gateway, "/v1/completions", COMPLETION))
    admission = gateway.admission("A")
    await wait_until(lambda: admission.queued == 1)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await wait_until(lambda: admission.queued == 0)
    assert (admission.abandoned_total, admission.admitted_total) == (1, 0)
    async with http.get(gateway.url + "/metrics") as response:
        lines = (await response.text()).splitlines()
    assert 'slotshift_gateway_requests_abandoned_total{pool="p",tenant="A"} 1.0' in lines


async def test_headers_are_cleaned_and_a_request_id_added(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    _, _, headers = await post(
        http,
        gateway,
        "/v1/completions",
        COMPLETION,
        headers={"Connection": "keep-alive, X-Hop", "X-Hop": "1", "X-Custom": "kept"},
    )
    seen = {k.lower(): v for k, v in engine.headers_seen[-1].items()}
    assert "authorization" not in seen
    assert "x-hop" not in seen
    assert seen["x-custom"] == "kept"
    assert seen["x-request-id"] == headers["X-Request-Id"]
    assert len(seen["x-request-id"]) >= 16

    await post(http, gateway, "/v1/completions", COMPLETION, headers={"X-Request-Id": "req-42"})
    assert {k.lower(): v for k, v in engine.headers_seen[-1].items()}["x-request-id"] == "req-42"


async def test_a_cookie_the_engine_set_for_one_tenant_never_goes_with_another_tenants_request(
    start_gateway: StartGateway, engine: FakeEngine
) -> None:
    # The client whose answer set it gets it; the gateway keeps no cookie jar of its own.
    engine.set_cookie = "route=replica-1; Path=/"
    # By its name: aiohttp's default jar would keep no cookie of an IP address's.
    gateway = await start_gateway(engine_url=engine.url.replace("127.0.0.1", "localhost"))
    # Clients that keep no cookies either: a cookie reaching the engine came from the gateway.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        _, _, headers = await post(http, gateway, "/v1/completions", COMPLETION, tenant="A")
        assert headers["Set-Cookie"] == "route=replica-1; Path=/"
        await post(http, gateway, "/v1/completions", COMPLETION, tenant="B")
    assert [k for k in engine.headers_seen[-1] if k.lower() == "cookie"] == []


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        pytest.param({}, b"{}", 401, "missing_api_key", id="no-key"),
        pytest.param(
            {"Authorization": "Bearer nope"}, b"{}", 401, "invalid_api_key", id="unknown-key"
        ),
        pytest.param(
            {"Authorization": "Token key-a"}, b"{}", 401, "malformed_authorization", id="malformed"
        ),
        pytest.param(auth("A"), b"{not json", 400, "invalid_json", id="bad-json"),
        pytest.param(auth("A"), b"[1, 2]", 400, "invalid_json", id="not-an-object"),
        pytest.param(
            auth("A"), b'{"p": "' + b"x" * 2048 + b'"}', 413, "request_too_large", id="big"
        ),
    ],
)
async def test_bad_requests_get_openai_errors_and_never_reach_the_engine(
    start_gateway: StartGateway,
    engine: FakeEngine,
    http: aiohttp.ClientSession,
    headers: dict[str, str],
    body: bytes,
    status: int,
    code: str,
) -> None:
    gateway = await start_gateway(max_body_bytes=1024)
    async with http.post(
        gateway.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", **headers},
    ) as response:
        assert response.status == status
        error = (await response.json())["error"]
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}
    assert "key-a" not in error["message"]
    assert not engine.headers_seen
    assert gateway.admission("A").admitted_total == 0


async def test_a_full_queue_gets_429_with_retry_after(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(queue_max_depth=0, retry_after_s=3)
    set_limits(gateway, 1, A=0, B=4)
    status, payload, headers = await post(http, gateway, "/v1/completions", COMPLETION)
    assert (status, headers["Retry-After"], payload["error"]["code"]) == (429, "3", "queue_full")
    assert gateway.admission("A").rejected_by_reason["queue_full"] == 1


async def test_a_queue_timeout_gets_503_with_retry_after(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(queue_timeout_s=0.05)
    set_limits(gateway, 1, A=0, B=4)
    status, payload, headers = await post(http, gateway, "/v1/completions", COMPLETION)
    assert (status, headers["Retry-After"], payload["error"]["code"]) == (503, "1", "queue_timeout")
    assert gateway.admission("A").queued == 0


@pytest.mark.parametrize(
    ("behaviour", "timeout_s", "status", "code"),
    [
        pytest.param("reset", 30.0, 502, "upstream_unavailable", id="connection-reset"),
        pytest.param("hang", 0.2, 504, "upstream_timeout", id="timeout"),
    ],
)
async def test_upstream_failures_become_502_or_504_and_free_the_slot(
    start_gateway: StartGateway,
    engine: FakeEngine,
    http: aiohttp.ClientSession,
    behaviour: Any,
    timeout_s: float,
    status: int,
    code: str,
) -> None:
    gateway = await start_gateway(upstream_timeout_s=timeout_s)
    engine.behaviour = behaviour
    got, payload, _ = await post(http, gateway, "/v1/chat/completions", CHAT)
    assert (got, payload["error"]["code"]) == (status, code)
    admission = gateway.admission("A")
    assert (admission.in_flight, admission.completed_total) == (0, 1)
    assert len(gateway.state.tenants["A"].e2e) == 0


async def test_an_unreachable_engine_is_502(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(engine_url=f"http://127.0.0.1:{free_port()}")
    status, payload, _ = await post(http, gateway, "/v1/completions", COMPLETION)
    assert (status, payload["error"]["type"]) == (502, "upstream_error")
    assert gateway.admission("A").in_flight == 0


@pytest.mark.parametrize("engine_status", [400, 404, 503])
async def test_engine_errors_pass_through_with_their_body(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession, engine_status: int
) -> None:
    gateway = await start_gateway()
    engine.behaviour, engine.error_status = "status", engine_status
    status, payload, _ = await post(http, gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    assert status == engine_status
    assert payload["code"] == engine_status
    assert payload["message"] == "The model `x` does not exist."


async def test_an_engine_failing_mid_stream_ends_the_stream_with_an_error_event(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    engine.behaviour = "reset_mid_stream"
    async with http.post(
        gateway.url + "/v1/completions", json={**COMPLETION, "stream": True}, headers=auth("A")
    ) as response:
        assert response.status == 200
        body = await response.read()
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: {")]
    assert events[0]["choices"][0]["text"] == "Hello"
    assert events[-1]["error"]["code"] == "upstream_unavailable"
    await wait_until(lambda: gateway.admission("A").in_flight == 0)


async def test_models_needs_a_key_but_no_slot(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    set_limits(gateway, 1, A=0, B=0)
    async with http.get(gateway.url + "/v1/models", headers=auth("B")) as response:
        assert response.status == 200
        assert (await response.json())["data"][0]["id"] == "fake"
    assert "authorization" not in {k.lower() for k in engine.headers_seen[-1]}
    async with http.get(gateway.url + "/v1/models") as response:
        assert response.status == 401


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405)],
)
async def test_unknown_routes_get_openai_errors(
    start_gateway: StartGateway, http: aiohttp.ClientSession, method: str, path: str, status: int
) -> None:
    gateway = await start_gateway()
    async with http.request(method, gateway.url + path, headers=auth("A")) as response:
        assert response.status == status
        assert set((await response.json())["error"]) == {"message", "type", "param", "code"}


async def test_metrics_show_limits_usage_and_rejections(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(queue_max_depth=0)
    await post(http, gateway, "/v1/completions", COMPLETION)
    set_limits(gateway, 7, A=0, B=5)
    await post(http, gateway, "/v1/completions", COMPLETION)
    async with http.get(gateway.url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    expected = [
        'slotshift_gateway_tenant_limit_slots{pool="p",tenant="A"} 0.0',
        'slotshift_gateway_tenant_limit_slots{pool="p",tenant="B"} 5.0',
        'slotshift_gateway_tenant_target_slots{pool="p",tenant="B"} 5.0',
        'slotshift_gateway_requests_in_flight{pool="p",tenant="A"} 0.0',
        'slotshift_gateway_requests_queued{pool="p",tenant="A"} 0.0',
        'slotshift_gateway_requests_admitted_total{pool="p",tenant="A"} 1.0',
        'slotshift_gateway_requests_completed_total{pool="p",tenant="A"} 1.0',
        'slotshift_gateway_requests_rejected_total{pool="p",reason="queue_full",tenant="A"} 1.0',
        'slotshift_gateway_queue_wait_seconds_count{pool="p",tenant="A"} 1.0',
        'slotshift_gateway_allocation_version{pool="p"} 7.0',
        'slotshift_gateway_controlplane_connected{pool="p"} 0.0',
    ]
    missing = [line for line in expected if line not in text.splitlines()]
    assert not missing, text


@pytest.mark.parametrize(
    ("body", "document"),
    [
        pytest.param(b'{"a": [1, "\\u00e9"]}', {"a": [1, "é"]}, id="plain"),
        pytest.param(
            b'{"seed": 123456789012345678901234567890}',
            {"seed": 123456789012345678901234567890},
            id="integer-past-64-bits-stays-an-integer",
        ),
        pytest.param(b'{"a": "\\ud800"}', {"a": "\ud800"}, id="lone-surrogate"),
        pytest.param(b"\xef\xbb\xbf{}", {}, id="utf-8-bom"),
    ],
)
def test_a_body_reads_as_the_json_module_reads_it(body: bytes, document: dict[str, Any]) -> None:
    parsed = proxy_module._require_json_object(body)
    assert parsed == document
    assert [type(v) for v in parsed.values()] == [type(v) for v in document.values()]
