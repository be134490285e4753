"""Integration, real servers on port 0 in one process: two emulators serving one model as two
pools (replicas) and a third serving another model, behind one gateway. When one replica's
engine stops under load, a preemptible tenant's resumable requests running there go on at the
other replica: each client gets the full answer, the same as an uninterrupted request's (the
emulator's next token is a function of the context, and both replicas serve the same model),
with the true usage, in one stream where it streams. A tenant that is not preemptible has its
requests on the lost engine fail (502, or the engine's own 503), and the other model's requests
never fail. A preemptible tenant served by the lost replica only has its requests fail there
too, a streamed answer under way with one error event that ends its stream."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest

from slotshift.config import SlotshiftConfig, parse_config
from tests.integration.stack import Fleet, start_fleet
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEYS = {
    "P": "sk-resume-preemptible-3f1a09",
    "N": "sk-resume-steady-8c24d7",
    "Q": "sk-resume-stranded-61b0ce",
}
SMALL = "small"
LARGE = "large"
POOLS = {"small-a": SMALL, "small-b": SMALL, "large": LARGE}
LOST = "small-a"


def _config(urls: dict[str, str], grpc_port: int, *, stranded: bool = False) -> SlotshiftConfig:
    """The fleet; `stranded`: the replica to lose serves Q only, a preemptible tenant of no
    other pool, and the others P (Q beside P and N would change where their requests go)."""
    tenants: list[dict[str, Any]] = [
        {"name": "P", "api_keys": [KEYS["P"]], "preemptible": True},
        {"name": "N", "api_keys": [KEYS["N"]]},
    ]
    stranded_tenant = {"name": "Q", "api_keys": [KEYS["Q"]], "preemptible": True}
    return parse_config(
        {
            "pools": [
                {
                    "name": pool,
                    "models": [model],
                    "budget_slots": 8,
                    "engine_url": urls[pool],
                    "tenants": [stranded_tenant if pool == LOST else tenants[0]]
                    if stranded
                    else tenants,
                }
                for pool, model in POOLS.items()
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "gateway": {
                "pools": list(POOLS),
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "report_interval_s": 0.05,
                "replica_down_s": 30.0,
                "paused_keepalive_interval_s": 0.05,
            },
            # Steps of 15 ms: an answer of 48 tokens runs long enough for the engine to be
            # stopped in its middle; a short grace cuts what it still runs.
            "engine_sim": {
                "port": 0,
                "enable_prompt_tokens_details": True,
                "step_base_ms": 15.0,
                "shutdown_grace_s": 0.05,
            },
        }
    )


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with AsyncExitStack() as exits:
        yield await start_fleet(exits, _config, POOLS)


@pytest.fixture
async def stranded_fleet() -> AsyncIterator[Fleet]:
    async with AsyncExitStack() as exits:
        yield await start_fleet(exits, functools.partial(_config, stranded=True), POOLS)


async def _post(
    session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any], tenant: str
) -> tuple[int, bytes]:
    async with session.post(
        url + path, json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
    ) as response:
        return response.status, await response.read()


_CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30.0)
"""A stream the gateway broke (a second status line in its body) leaves aiohttp's reader waiting
(not on the socket: sock_read does not end it); this fails it long before the suite's timeout.
A healthy answer here takes about a second."""


def _events(raw: bytes) -> list[Any]:
    """A stream's data events in order: decoded JSON, or the "[DONE]" sentinel."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _answer(streamed: bool, raw: bytes) -> dict[str, Any]:
    """What a client reads from an answer: its text, finish, usage totals, ids and [DONE]s."""
    if not streamed:
        document = json.loads(raw)
        choice = document["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        return {
            "text": text,
            "finish_reason": choice["finish_reason"],
            "usage": _usage(document["usage"]),
            "ids": 1,
            "done": 0,
        }
    events = _events(raw)
    chunks = [event for event in events if isinstance(event, dict)]
    assert not any("error" in chunk for chunk in chunks), chunks
    text, finish, usage = "", None, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
        if chunk.get("usage"):
            usage = _usage(chunk["usage"])
    return {
        "text": text,
        "finish_reason": finish,
        "usage": usage,
        "ids": len({(chunk["id"], chunk["created"]) for chunk in chunks}),
        "done": events.count("[DONE]"),
    }


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    # Cached-token details differ by design (a continuation's prefix hits); totals must not.
    return {key: usage[key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")}


_COMPLETION = {
    "model": SMALL,
    "prompt": "the batch job summarises a long report",
    "max_tokens": 48,
    "ignore_eos": True,
}
_CHAT = {
    "model": SMALL,
    "messages": [{"role": "user", "content": "summarise the report, please"}],
    "max_tokens": 48,
    "ignore_eos": True,
}

# A streamed answer moves within its one stream (keepalive comments while it waits for the
# other replica's slot); include_usage adds the usage event that must carry the true totals.
_USAGE = {"stream": True, "stream_options": {"include_usage": True}}
SHAPES = [
    pytest.param("/v1/completions", _COMPLETION, id="completions"),
    pytest.param("/v1/chat/completions", _CHAT, id="chat"),
    pytest.param("/v1/completions", {**_COMPLETION, "stream": True}, id="completions-stream"),
    pytest.param("/v1/chat/completions", {**_CHAT, "stream": True}, id="chat-stream"),
    pytest.param("/v1/completions", {**_COMPLETION, **_USAGE}, id="completions-stream-usage"),
    pytest.param("/v1/chat/completions", {**_CHAT, **_USAGE}, id="chat-stream-usage"),
]


@pytest.mark.parametrize(("path", "body"), SHAPES)
async def test_a_lost_replicas_resumable_requests_finish_on_the_other(
    fleet: Fleet, path: str, body: dict[str, Any]
) -> None:
    gateway = fleet.gateways[0]
    url = f"http://127.0.0.1:{gateway.port}"
    lost = gateway.states[LOST]
    streamed = bool(body.get("stream"))
    steady = {"model": SMALL, "prompt": "a steady tenant's request", "max_tokens": 48}
    steady |= {"ignore_eos": True}
    other_model = {**steady, "model": LARGE}
    async with aiohttp.ClientSession(timeout=_CLIENT_TIMEOUT) as session:
        status, raw = await _post(session, url, path, body, "P")
        assert status == 200, raw
        expected = _answer(streamed, raw)
        resumable = [
            asyncio.create_task(_post(session, url, path, body, "P"), name=f"P-{index}")
            for index in range(4)
        ]
        ordinary = [
            asyncio.create_task(_post(session, url, "/v1/completions", steady, "N"), name=f"N-{i}")
            for i in range(4)
        ]
        others = [
            asyncio.create_task(
                _post(session, url, "/v1/completions", other_model, tenant), name=f"L-{tenant}"
            )
            for tenant in ("P", "N")
        ]
        engine = fleet.engines[LOST]
        await wait_until(
            lambda: (
                lost.tenants["P"].admission.in_flight >= 1
                and lost.tenants["N"].admission.in_flight >= 1
                and engine.num_running >= 2
            ),
            message="both tenants' requests running on the replica to lose",
        )
        steps = engine.engine.core.steps_total
        await wait_until(
            lambda: engine.engine.core.steps_total >= steps + 4,
            message="a few tokens generated there",
        )
        assert not any(task.done() for task in resumable), "answers ended before the loss"
        await engine.stop()
        moved = await asyncio.gather(*resumable)
        failed = await asyncio.gather(*ordinary)
        other = await asyncio.gather(*others)
    for status, raw in moved:
        assert status == 200, raw
        got = _answer(streamed, raw)
        assert got == {**expected, "ids": 1}, "one uninterrupted answer, the true usage"
    moved_out = lost.tenants["P"].moved_out_total
    moved_in = gateway.states["small-b"].tenants["P"].moved_in_total
    assert moved_out >= 1 and moved_in == moved_out
    assert lost.tenants["N"].moved_out_total == 0
    statuses = [status for status, _ in failed]
    assert 502 in statuses or 503 in statuses, "the steady tenant's requests on A failed"
    assert set(statuses) <= {200, 502, 503}
    for status, raw in failed:
        if status == 503:
            assert b"shutting down" in raw or b"aborted" in raw, raw
    assert [status for status, _ in other] == [200, 200], "the other model never fails"
    assert lost.tenants["P"].admission.in_flight == 0, "the lost replica's slots are free"
    scrape = gateway.metrics.exposition().decode()
    assert (
        f'slotshift_gateway_requests_moved_total{{direction="out",pool="{LOST}",tenant="P"}} '
        f"{float(moved_out)}" in scrape
    )


async def _post_begun(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    body: dict[str, Any],
    tenant: str,
    begun: asyncio.Event,
) -> tuple[int, bytes]:
    """_post, setting `begun` once the answer's first bytes came (at once for a status that is
    not 200)."""
    async with session.post(
        url + path, json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
    ) as response:
        first = await response.content.readany() if response.status == 200 else b""
        begun.set()
        return response.status, first + await response.read()


@pytest.mark.parametrize(("path", "body"), SHAPES)
async def test_a_resumable_request_with_no_other_replica_fails(
    stranded_fleet: Fleet, path: str, body: dict[str, Any]
) -> None:
    gateway = stranded_fleet.gateways[0]
    url = f"http://127.0.0.1:{gateway.port}"
    lost = gateway.states[LOST].tenants["Q"]
    streamed = bool(body.get("stream"))
    engine = stranded_fleet.engines[LOST]
    begun = [asyncio.Event() for _ in range(2)]
    async with aiohttp.ClientSession(timeout=_CLIENT_TIMEOUT) as session:
        requests = [
            asyncio.create_task(_post_begun(session, url, path, body, "Q", event), name="Q")
            for event in begun
        ]
        await wait_until(
            lambda: (
                engine.num_running >= 2 and (not streamed or all(event.is_set() for event in begun))
            ),
            message="Q's requests running, their streams under way",
        )
        steps = engine.engine.core.steps_total
        await wait_until(
            lambda: engine.engine.core.steps_total >= steps + 4,
            message="a few tokens generated",
        )
        assert not any(task.done() for task in requests), "answers ended before the loss"
        await engine.stop()
        answers = await asyncio.gather(*requests)
    for status, raw in answers:
        if not streamed:
            assert status in (502, 503), raw
            continue
        assert status == 200, raw
        events = _events(raw)
        assert events and all(isinstance(event, dict) for event in events), "no [DONE]"
        errors = [event for event in events if "error" in event]
        assert errors == events[-1:], "the stream under way ends with its one error event"
        assert errors[0]["error"]["code"] == "upstream_unavailable"
        assert len({(event["id"], event["created"]) for event in events[:-1]}) == 1
    assert lost.moved_out_total == 0, "nowhere to move"
    assert lost.admission.in_flight == 0, "the lost replica's slots are free"
