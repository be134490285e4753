"""Upstream faults against a real gateway process: an engine that answers 5xx (vLLM's 503
admission rejection among them), hangs, resets connections (TCP RST) before, during and in the
middle of a stream, or is killed with SIGKILL under load and started again on the same port;
clients that leave mid-stream or give up while queued.

Each test ends with every admitted slot released exactly once, read from the gateway's own
/metrics: nothing in flight or queued, and admitted == completed. Clients always get an answer
(every call has a timeout): OpenAI-style JSON errors with the right status, or, once a stream
has begun, an SSE error event. The in-process tier (tests/unit/admission_gateway/test_proxy.py)
covers the same paths against a fake engine in the test's own event loop; this tier uses a real
gateway process, real sockets and real signals.

The faulty engine runs in the test process, on a fixed port the gateway's config names; each
request picks its fault by its prompt. The gateway runs without a control plane, on its
fallback split (fallback_replicas 1: each tenant's nominal share, LIMIT slots).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.service_processes import ServiceProcesses, http_ok, wait_ready
from tests.support import free_port, wait_until

pytestmark = pytest.mark.e2e

HOST = "127.0.0.1"
BUDGET = 8
LIMIT = 4
"""Each tenant's slots at the gateway: half the budget."""
QUEUE_DEPTH = 4
UPSTREAM_TIMEOUT_S = 1.0
CLIENT_TIMEOUT_S = 20.0
MODEL = "Qwen/Qwen2.5-3B-Instruct"
ERROR_FIELDS = {"message", "type", "param", "code"}


def _gateway_config(engine_port: int, gateway_port: int) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "default",
                "budget_slots": BUDGET,
                "engine_url": f"http://{HOST}:{engine_port}",
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 1},
                    {"name": "B", "api_keys": ["key-b"], "floor_slots": 1},
                ],
            }
        ],
        "gateway": {
            "port": gateway_port,
            # Nothing listens there: the gateway keeps its fallback split throughout.
            "controlplane_target": f"{HOST}:{free_port()}",
            "fallback_replicas": 1,
            "queue_max_depth": QUEUE_DEPTH,
            "queue_timeout_s": 10.0,
            "upstream_timeout_s": UPSTREAM_TIMEOUT_S,
            "retry_after_s": 2,
        },
        "engine_sim": {"port": engine_port},
    }


@dataclass
class Gateway:
    url: str
    engine_port: int


@dataclass
class FaultyEngine:
    """An OpenAI-like engine whose every request fails as its prompt says (see _answer)."""

    port: int
    received: int = 0
    cancelled: int = 0
    """Requests whose connection the gateway dropped before they were answered."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """`held` requests wait for it."""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/completions", self._handle),
                web.post("/v1/chat/completions", self._handle),
            ]
        )
        # handler_cancellation, as in vLLM: a dropped connection cancels the request.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, HOST, self.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.received += 1
        body = await request.json()
        fault = body.get("prompt") or body["messages"][0]["content"]
        try:
            return await self._answer(request, str(fault), bool(body.get("stream")))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _answer(self, request: web.Request, fault: str, stream: bool) -> web.StreamResponse:
        if fault == "busy":
            # vLLM's admission rejection (--max-num-queued-reqs): 503, no Retry-After.
            error = {
                "message": "The engine is busy; too many requests queued.",
                "type": "ServiceUnavailableError",
                "param": None,
                "code": 503,
            }
            return web.json_response({"error": error}, status=503)
        if fault == "crash":
            # What uvicorn answers when a handler raises: plain text, not JSON.
            return web.Response(status=500, text="Internal Server Error")
        if fault in ("hang", "reset"):
            if fault == "reset":
                _reset(request)
            await asyncio.Event().wait()
        if fault == "reset-mid-response":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = 10_000
            await response.prepare(request)
            await response.write(b'{"id": "cmpl-1", "choices": [')
            await asyncio.sleep(0.05)
            _reset(request)
            await asyncio.Event().wait()
        if fault == "held":
            await self.release.wait()
        if not stream:
            return web.json_response(
                {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "ok"}]}
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(200):
            event = {"id": "cmpl-1", "choices": [{"index": 0, "text": f"t{index}"}]}
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            if index == 1 and fault == "reset-mid-stream":
                await asyncio.sleep(0.05)
                _reset(request)
                await asyncio.Event().wait()
            if index == 1 and fault == "hang-mid-stream":
                await asyncio.Event().wait()
            if fault != "slow-stream" and index == 2:
                break
            await asyncio.sleep(0.05)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _reset(request: web.Request) -> None:
    """Drop the connection with a TCP RST (SO_LINGER 0), as a crashed peer or a middlebox does."""
    transport = request.transport
    assert transport is not None
    transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
    )
    transport.abort()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    engine_port, gateway_port = free_port(), free_port()
    services = ServiceProcesses(
        tmp_path_factory.mktemp("upstream-faults"), _gateway_config(engine_port, gateway_port)
    )
    try:
        services.start("gateway", "gateway", "--gateway-id", "gw-faults")
        wait_ready(lambda: http_ok(f"http://{HOST}:{gateway_port}/ready"), "the gateway")
        yield Gateway(f"http://{HOST}:{gateway_port}", engine_port)
        assert services.running("gateway"), services.log("gateway")
    finally:
        services.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session


@pytest.fixture
async def engine(gateway: Gateway, http: aiohttp.ClientSession) -> AsyncIterator[FaultyEngine]:
    faulty = FaultyEngine(gateway.engine_port)
    await faulty.start()
    try:
        yield faulty
        faulty.release.set()
        await wait_until(
            lambda: _settled(http, gateway.url),
            timeout_s=10,
            message="the gateway to hold nothing, with every admitted request completed",
        )
    finally:
        await faulty.stop()


async def _gateway_metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if "tenant" in sample.labels and name.startswith("slotshift_gateway_requests_"):
                totals[name] = totals.get(name, 0.0) + sample.value
    return totals


async def _settled(http: aiohttp.ClientSession, url: str) -> bool:
    metrics = await _gateway_metrics(http, url)
    return (
        metrics["slotshift_gateway_requests_in_flight"] == 0
        and metrics["slotshift_gateway_requests_queued"] == 0
        and metrics["slotshift_gateway_requests_admitted_total"]
        == metrics["slotshift_gateway_requests_completed_total"]
    )


def _auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{tenant.lower()}"}


def _body(fault: str, *, chat: bool, stream: bool, max_tokens: int = 16) -> dict[str, Any]:
    if chat:
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": fault}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    return {"model": MODEL, "prompt": fault, "max_tokens": max_tokens, "stream": stream}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        """The OpenAI-style error of a JSON error response."""
        document = json.loads(self.body)
        assert set(document) == {"error"}, document
        error: dict[str, Any] = document["error"]
        assert set(error) == ERROR_FIELDS, error
        return error

    def stream_events(self) -> list[dict[str, Any]]:
        return [
            json.loads(line[len(b"data: ") :])
            for line in self.body.splitlines()
            if line.startswith(b"data: {")
        ]


async def _call(
    http: aiohttp.ClientSession, gateway: Gateway, tenant: str, body: dict[str, Any]
) -> Answer:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    async with http.post(gateway.url + path, json=body, headers=_auth(tenant)) as response:
        return Answer(response.status, dict(response.headers), await response.read())


STREAMED_OR_NOT = pytest.mark.parametrize(
    ("chat", "stream"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["completion", "chat", "completion-stream", "chat-stream"],
)


@STREAMED_OR_NOT
async def test_vllms_503_engine_busy_reaches_clients_as_an_openai_error_with_retry_after(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession, chat: bool, stream: bool
) -> None:
    answers = await asyncio.gather(
        *(
            _call(http, gateway, tenant, _body("busy", chat=chat, stream=stream))
            for tenant in ("A", "B")
            for _ in range(LIMIT + 2)
        )
    )
    for answer in answers:
        assert answer.status == 503
        assert answer.error()["message"] == "The engine is busy; too many requests queued."
        # vLLM sends none; the gateway says when to come back, as for its own 503s.
        assert answer.headers.get("Retry-After") == "2"
    assert engine.received == len(answers)


@STREAMED_OR_NOT
async def test_an_engine_crash_with_a_plain_text_500_becomes_an_openai_error(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession, chat: bool, stream: bool
) -> None:
    answer = await _call(http, gateway, "A", _body("crash", chat=chat, stream=stream))
    assert answer.status == 500
    assert answer.headers["Content-Type"].startswith("application/json")
    error = answer.error()
    assert error["type"] == "upstream_error"
    assert "Internal Server Error" in error["message"]


async def test_an_engine_that_hangs_gets_504_and_its_request_aborted(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession
) -> None:
    answers = await asyncio.gather(
        *(_call(http, gateway, "A", _body("hang", chat=False, stream=False)) for _ in range(6))
    )
    for answer in answers:
        assert answer.status == 504
        assert answer.error()["code"] == "upstream_timeout"
    # The gateway dropped each connection, so the engine stopped working on it.
    await wait_until(lambda: engine.cancelled == 6, message="the engine to see every abort")


async def test_a_stream_that_stalls_ends_with_a_timeout_event(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession
) -> None:
    answer = await _call(http, gateway, "B", _body("hang-mid-stream", chat=True, stream=True))
    assert answer.status == 200
    events = answer.stream_events()
    assert [e["choices"][0]["text"] for e in events[:2]] == ["t0", "t1"]
    assert events[-1]["error"]["code"] == "upstream_timeout"
    assert set(events[-1]["error"]) == ERROR_FIELDS
    await wait_until(lambda: engine.cancelled == 1, message="the engine to see the abort")


@pytest.mark.parametrize("fault", ["reset", "reset-mid-response"])
async def test_a_connection_reset_before_or_during_the_response_is_502(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession, fault: str
) -> None:
    answers = await asyncio.gather(
        *(
            _call(http, gateway, tenant, _body(fault, chat=chat, stream=False))
            for tenant in ("A", "B")
            for chat in (False, True)
        )
    )
    for answer in answers:
        assert answer.status == 502
        assert answer.error()["code"] == "upstream_unavailable"


async def test_a_connection_reset_mid_stream_ends_the_stream_with_an_error_event(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession
) -> None:
    answers = await asyncio.gather(
        *(
            _call(http, gateway, tenant, _body("reset-mid-stream", chat=False, stream=True))
            for tenant in ("A", "B")
        )
    )
    for answer in answers:
        assert answer.status == 200
        events = answer.stream_events()
        assert [e["choices"][0]["text"] for e in events[:2]] == ["t0", "t1"]
        assert events[-1]["error"]["code"] == "upstream_unavailable"
        assert b"[DONE]" not in answer.body


async def test_clients_leaving_mid_stream_abort_the_engine_request(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession
) -> None:
    async def leave_after_first_chunk(tenant: str) -> None:
        body = _body("slow-stream", chat=True, stream=True)
        async with http.post(
            gateway.url + "/v1/chat/completions", json=body, headers=_auth(tenant)
        ) as response:
            assert response.status == 200
            assert (await response.content.readany()).startswith(b"data: {")
            response.close()

    await asyncio.gather(*(leave_after_first_chunk(t) for t in ("A", "A", "A", "B", "B")))
    await wait_until(lambda: engine.cancelled == 5, message="the engine to see every abort")
    await wait_until(lambda: _settled(http, gateway.url), message="every slot released")
    # The slots are usable again at once.
    answer = await _call(http, gateway, "A", _body("ok", chat=False, stream=False))
    assert answer.status == 200


async def test_requests_cancelled_while_queued_leave_the_queue_and_never_reach_the_engine(
    gateway: Gateway, engine: FaultyEngine, http: aiohttp.ClientSession
) -> None:
    before = await _gateway_metrics(http, gateway.url)
    held = [
        asyncio.create_task(_call(http, gateway, "A", _body("held", chat=False, stream=False)))
        for _ in range(LIMIT)
    ]
    await wait_until(lambda: engine.received == LIMIT, message="A's slots to fill")
    waiting = [
        asyncio.create_task(_call(http, gateway, "A", _body("ok", chat=False, stream=False)))
        for _ in range(3)
    ]

    async def queued() -> float:
        return (await _gateway_metrics(http, gateway.url))["slotshift_gateway_requests_queued"]

    await wait_until(lambda: _equals(queued(), 3), message="three requests queued")
    # Another tenant's slots are its own: B passes while A's queue waits.
    assert (await _call(http, gateway, "B", _body("ok", chat=False, stream=False))).status == 200
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    await wait_until(lambda: _equals(queued(), 0), message="the cancelled requests to leave")
    after = await _gateway_metrics(http, gateway.url)
    abandoned = "slotshift_gateway_requests_abandoned_total"
    assert after[abandoned] - before.get(abandoned, 0) == 3
    engine.release.set()
    assert [a.status for a in await asyncio.gather(*held)] == [200] * LIMIT
    assert engine.received == LIMIT + 1, "no cancelled request reached the engine"


async def _equals(value: Any, expected: float) -> bool:
    return bool(await value == expected)


@dataclass
class Outcomes:
    statuses: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def _closed_loop(
    http: aiohttp.ClientSession, gateway: Gateway, tenant: str, stream: bool, seen: Outcomes
) -> None:
    while not seen.stop.is_set():
        body = _body("restart", chat=stream, stream=stream, max_tokens=120)
        body["ignore_eos"] = True
        try:
            answer = await _call(http, gateway, tenant, body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            seen.statuses.append(type(exc).__name__)
            continue
        if answer.status != 200:
            assert answer.error()["code"] == "upstream_unavailable", answer.body
            seen.statuses.append(f"HTTP {answer.status}")
            await asyncio.sleep(0.05)
        elif stream and answer.stream_events()[-1].get("error"):
            assert answer.stream_events()[-1]["error"]["code"] == "upstream_unavailable"
            seen.statuses.append("stream error event")
        else:
            seen.statuses.append("ok")


async def test_an_engine_killed_under_load_and_restarted_on_its_port(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    engine_port, gateway_port = free_port(), free_port()
    services = ServiceProcesses(tmp_path, _gateway_config(engine_port, gateway_port))
    target = Gateway(f"http://{HOST}:{gateway_port}", engine_port)
    seen = Outcomes()
    try:
        services.start("engine", "engine-sim")
        wait_ready(lambda: http_ok(f"http://{HOST}:{engine_port}/health"), "the emulator")
        services.start("gateway", "gateway", "--gateway-id", "gw-restart")
        wait_ready(lambda: http_ok(f"{target.url}/ready"), "the gateway")
        assert LIMIT == QUEUE_DEPTH, "each tenant's clients fill its slots and queue, no more"
        clients = [
            asyncio.create_task(_closed_loop(http, target, tenant, stream, seen))
            for tenant in ("A", "B")
            for stream in (False, True)
            for _ in range(LIMIT)
        ]
        try:
            await wait_until(lambda: seen.statuses.count("ok") >= 8, message="load flowing")
            await wait_until(
                lambda: _equals(_in_flight(http, target), 2 * LIMIT),
                message="every slot busy",
            )
            killed_at = len(seen.statuses)
            services.kill("engine")
            await wait_until(
                lambda: {"HTTP 502", "stream error event"} <= set(seen.statuses[killed_at:]),
                message="requests cut off by the kill, and those sent after it, to fail at once",
            )
            services.start("engine", "engine-sim")
            await asyncio.to_thread(
                wait_ready,
                lambda: http_ok(f"http://{HOST}:{engine_port}/health"),
                "the emulator again",
            )
            back_at = len(seen.statuses)
            await wait_until(
                lambda: seen.statuses[back_at:].count("ok") >= 8,
                timeout_s=20,
                message="requests to succeed again once the engine is back",
            )
        finally:
            seen.stop.set()
            await asyncio.gather(*clients)
        await wait_until(lambda: _settled(http, target.url), message="every slot released")
        assert services.running("gateway"), services.log("gateway")
    finally:
        services.close()
    failures = set(seen.statuses) - {"ok"}
    assert failures, "the kill must have cut requests off"
    assert failures <= {"HTTP 502", "stream error event"}, seen.statuses


async def _in_flight(http: aiohttp.ClientSession, gateway: Gateway) -> float:
    return (await _gateway_metrics(http, gateway.url))["slotshift_gateway_requests_in_flight"]
