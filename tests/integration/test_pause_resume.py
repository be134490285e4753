"""Integration, real servers on port 0 in one process: a preemptible tenant's requests paused and
resumed by a real gateway in front of the emulator, whose next token is a function of the
context. A paused answer, of every resumable shape, equals the answer never paused; shapes off
the resumable list are never paused; the engine never holds more than the budget."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from admission_gateway.gateway import AdmissionGateway
from admission_gateway.gateway_state import TenantLimit
from engine_sim.server import EngineSim
from slotshift.config import SlotshiftConfig, parse_config
from tests.support import wait_until

BUDGET = 4
KEYS = {"A": "key-a", "B": "key-b"}


def _config() -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "p",
                    "budget_slots": BUDGET,
                    "engine_url": "http://127.0.0.1:1",
                    "tenants": [
                        {"name": "A", "api_keys": [KEYS["A"]]},
                        {"name": "B", "api_keys": [KEYS["B"]], "preemptible": True},
                    ],
                }
            ],
            "gateway": {
                "pool": "p",
                "port": 0,
                # Nothing listens there: the test applies allocations itself.
                "controlplane_target": "127.0.0.1:1",
                "fallback_replicas": 1,
                "reconnect_initial_s": 0.05,
                "reconnect_max_s": 0.2,
                "drain_timeout_s": 2.0,
                "paused_keepalive_interval_s": 0.05,
            },
            # Steps of at least 15 ms: a pause called for after a few steps lands well before
            # the answer's end even on a loaded machine (the engine catches up at most 50 ms).
            "engine_sim": {
                "port": 0,
                "model_name": "m",
                "enable_prompt_tokens_details": True,
                "step_base_ms": 15.0,
            },
        }
    )


class Harness:
    """An emulator and a gateway, and the allocations the test applies to the gateway."""

    def __init__(self, engine: EngineSim, gateway: AdmissionGateway) -> None:
        self.engine = engine
        self.gateway = gateway
        self._version = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    def apply(self, b_limit: int, *, pause_above: int | None = None) -> None:
        self._version += 1
        limits = [
            TenantLimit("A", target_slots=BUDGET - b_limit, limit_slots=BUDGET - b_limit),
            TenantLimit("B", b_limit, b_limit, pause_above_slots=pause_above),
        ]
        assert self.gateway.state.apply_allocation(self._version, limits)

    @property
    def b(self) -> Any:
        return self.gateway.state.tenants["B"]


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    config = _config()
    engine = EngineSim(config.engine_sim)
    await engine.start()
    pool = config.pools[0].model_copy(update={"engine_url": engine.url})
    config = config.model_copy(update={"pools": [pool]})
    gateway = AdmissionGateway(config, gateway_id="gw-1")
    await gateway.start()
    try:
        yield Harness(engine, gateway)
    finally:
        await gateway.stop()
        await engine.stop()


async def _post(
    session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any], tenant: str
) -> tuple[int, bytes]:
    async with session.post(
        url + path, json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
    ) as response:
        return response.status, await response.read()


def _events(raw: bytes) -> list[Any]:
    """The JSON payloads of an SSE body, [DONE] as the string; comments dropped."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _answer(path: str, streamed: bool, raw: bytes) -> dict[str, Any]:
    """What a client reads from an answer: text, token ids, finish, usage, identities."""
    if not streamed:
        document = json.loads(raw)
        choice = document["choices"][0]
        text = choice["text"] if path.endswith("/completions") and "text" in choice else None
        if text is None:
            text = choice["message"]["content"]
        return {
            "text": text,
            "token_ids": choice.get("token_ids"),
            "finish_reason": choice["finish_reason"],
            "usage": _usage(document["usage"]),
            "ids": {document["id"]},
            "done": 0,
        }
    events = _events(raw)
    chunks = [e for e in events if isinstance(e, dict)]
    text = ""
    token_ids: list[int] = []
    finish = None
    usage = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            token_ids += choice.get("token_ids") or []
            finish = choice.get("finish_reason") or finish
        if chunk.get("usage"):
            usage = _usage(chunk["usage"])
    return {
        "text": text,
        "token_ids": token_ids or None,
        "finish_reason": finish,
        "usage": usage,
        "ids": {(c["id"], c["created"]) for c in chunks},
        "done": events.count("[DONE]"),
    }


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    # prompt_tokens_details differ by design: a resumed answer's cached tokens are the
    # continuation's (docs/preemption.md); the totals must be the true ones.
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


_COMPLETION = {"model": "m", "prompt": "the batch job summarises a long report", "max_tokens": 48}
_CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "summarise the report, please"}],
    "max_tokens": 48,
}

SHAPES = [
    pytest.param("/v1/completions", {**_COMPLETION, "stream": True}, id="completions-stream"),
    pytest.param(
        "/v1/completions",
        {**_COMPLETION, "stream": True, "stream_options": {"include_usage": True}},
        id="completions-stream-usage",
    ),
    pytest.param(
        "/v1/completions",
        {**_COMPLETION, "stream": True, "return_token_ids": True, "ignore_eos": True},
        id="completions-stream-token-ids",
    ),
    pytest.param("/v1/completions", {**_COMPLETION, "ignore_eos": True}, id="completions"),
    pytest.param(
        "/v1/completions",
        {**_COMPLETION, "prompt": list(range(100, 140)), "min_tokens": 30},
        id="completions-token-prompt-min-tokens",
    ),
    pytest.param(
        "/v1/chat/completions",
        {**_CHAT, "stream": True, "stream_options": {"include_usage": True}},
        id="chat-stream-usage",
    ),
    pytest.param(
        "/v1/chat/completions",
        {**_CHAT, "stream": True, "return_token_ids": True, "ignore_eos": True},
        id="chat-stream-token-ids",
    ),
    pytest.param("/v1/chat/completions", {**_CHAT, "ignore_eos": True}, id="chat"),
]


@pytest.mark.parametrize(("path", "body"), SHAPES)
async def test_a_paused_answer_equals_the_answer_never_paused(
    harness: Harness, path: str, body: dict[str, Any]
) -> None:
    harness.apply(b_limit=2)
    async with aiohttp.ClientSession() as session:
        status, reference = await _post(session, harness.url, path, body, "B")
        assert status == 200, reference
        request = asyncio.create_task(
            _post(session, harness.url, path, body, "B"), name="paused request"
        )
        # Pause it twice, each time once the engine has run a few steps of it.
        core = harness.engine.engine.core
        for _ in range(2):
            wanted = core.steps_total + 4
            await wait_until(
                lambda: core.steps_total >= wanted,  # noqa: B023 (awaited in this iteration)
                message="the request to run a few steps",
            )
            harness.apply(b_limit=0, pause_above=0)
            await wait_until(
                lambda: harness.b.admission.paused == 1 or request.done(),
                message="the pause",
            )
            assert not request.done(), "the answer ended before the pause took effect"
            await wait_until(
                lambda: harness.engine.num_running + harness.engine.num_waiting == 0,
                timeout_s=1.0,
                message="the engine to abort the paused request",
            )
            harness.apply(b_limit=2)
        status, paused = await request
    assert status == 200, paused
    streamed = bool(body.get("stream"))
    expected = _answer(path, streamed, reference)
    got = _answer(path, streamed, paused)
    assert harness.b.admission.pauses_total == 2
    assert got["text"] == expected["text"]
    assert got["token_ids"] == expected["token_ids"]
    assert got["finish_reason"] == expected["finish_reason"]
    assert got["usage"] == expected["usage"]
    assert len(got["ids"]) == 1, "one id and one created time throughout"
    assert got["done"] == expected["done"]
    if not body.get("return_token_ids"):
        assert b'token_ids": [' not in paused, "token ids stripped when not asked"
    assert harness.engine.peak_in_server <= BUDGET


NOT_RESUMABLE = [
    pytest.param("/v1/completions", {**_COMPLETION, "stream": True, "stop": ["."]}, id="stop"),
    pytest.param("/v1/completions", {**_COMPLETION, "stream": True, "seed": 7}, id="seed"),
    pytest.param("/v1/completions", {**_COMPLETION, "stream": True, "n": 2}, id="n-2"),
    pytest.param("/v1/completions", {**_COMPLETION, "logprobs": 2}, id="logprobs"),
    pytest.param("/v1/chat/completions", {**_CHAT, "stream": True, "seed": 3}, id="chat-seed"),
]


@pytest.mark.parametrize(("path", "body"), NOT_RESUMABLE)
async def test_a_shape_off_the_resumable_list_is_never_paused(
    harness: Harness, path: str, body: dict[str, Any]
) -> None:
    harness.apply(b_limit=2)
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(
            _post(session, harness.url, path, body, "B"), name="unpausable request"
        )
        # The emulator refuses some of these shapes at once (n > 1); the others run.
        await wait_until(
            lambda: request.done() or harness.b.admission.in_flight == 1, message="admission"
        )
        harness.apply(b_limit=0, pause_above=0)
        status, raw = await request
    assert harness.b.admission.pauses_total == 0
    # The emulator may refuse a shape it does not model; what matters is that it was not cut.
    assert status in (200, 400), raw


async def test_the_budget_holds_while_borrowed_work_pauses_for_a_lender(harness: Harness) -> None:
    # B borrows the whole budget; A bursts; B's youngest are paused and A runs at once.
    harness.apply(b_limit=BUDGET)
    harness.engine.reset_peak()
    body = {**_COMPLETION, "stream": True, "max_tokens": 32, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        borrowers = [
            asyncio.create_task(
                _post(session, harness.url, "/v1/completions", body, "B"), name=f"b{i}"
            )
            for i in range(6)
        ]
        await wait_until(lambda: harness.b.admission.in_flight == BUDGET, message="B fills")
        harness.apply(b_limit=1, pause_above=1)
        await wait_until(lambda: harness.b.admission.in_flight == 1, message="B pauses")
        lenders = [
            asyncio.create_task(
                _post(session, harness.url, "/v1/completions", body, "A"), name=f"a{i}"
            )
            for i in range(3)
        ]
        lent_back = await asyncio.gather(*lenders)
        harness.apply(b_limit=BUDGET)
        results = [*lent_back, *await asyncio.gather(*borrowers)]
    assert all(status == 200 for status, _ in results), results
    assert harness.b.admission.pauses_total >= BUDGET - 1
    assert harness.engine.peak_in_server <= BUDGET


async def test_a_streaming_client_that_goes_away_ends_its_resumable_request(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The client closes its connection mid-stream: the engine's work stops, the slot is free,
    the request ends as cancelled (not as the gateway's own error), and what the engine
    delivered is counted to the tenant."""
    body = {**_COMPLETION, "stream": True, "max_tokens": 400, "ignore_eos": True}
    harness.apply(2)
    received = 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            harness.url + "/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEYS['B']}"},
        ) as response,
    ):
        assert response.status == 200
        async for line in response.content:
            received += line.startswith(b"data: {")
            if received == 5:
                break
    await wait_until(
        lambda: harness.b.admission.in_flight == 0 and harness.engine.num_running == 0,
        message="the slot and the engine free",
    )
    (totals,) = harness.b.tokens.values()
    assert 5 <= totals.completion_tokens_total < 400
    assert totals.prompt_tokens_total > 0, "the prompt's ids were known before it ran"
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert not errors, [r.getMessage() for r in errors]
