"""Pause and resume over HTTP, as a gateway does it: close a stream, then continue it with a
completion of the prompt's ids plus the output's (return_token_ids); the token-id fields' shapes;
the prefix cache's counters; the budget witness."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_sim.server import EngineSim
from engine_sim.tokens import (
    chat_token_ids,
    reference_output_ids,
    text_token_ids,
    token_text,
)
from slotshift.config import EngineSimConfig
from tests.support import wait_until
from tests.unit.engine_sim.conftest import MODEL, fast_config

BLOCK = 16
EOS_MAX = 60
"""pseudo_eos_max_tokens: a mean output of 30.5 tokens without ignore_eos."""


def config(**overrides: Any) -> EngineSimConfig:
    return fast_config(
        **{"block_size_tokens": BLOCK, "pseudo_eos_max_tokens": EOS_MAX, **overrides}
    )


@pytest.fixture
def sim_config() -> EngineSimConfig:
    return config()


async def sse_chunks(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    pause_after_tokens: int | None = None,
) -> list[dict[str, Any]]:
    """The JSON chunks of a stream; with pause_after_tokens, the client closes the connection
    once it has read that many output tokens (the gateway's pause)."""
    chunks: list[dict[str, Any]] = []
    tokens = 0
    response = await http.post(url, json=body)
    try:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            chunks.append(chunk)
            if chunk["choices"] and chunk["choices"][0].get("token_ids"):
                tokens += len(chunk["choices"][0]["token_ids"])
            if pause_after_tokens is not None and tokens >= pause_after_tokens:
                break
    finally:
        response.close()
    return chunks


def output_ids(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids") or []]


def output_text(chunks: list[dict[str, Any]]) -> str:
    texts: list[str] = []
    for chunk in chunks:
        if not chunk["choices"]:
            continue
        choice = chunk["choices"][0]
        texts.append(choice["delta"].get("content", "") if "delta" in choice else choice["text"])
    return "".join(texts)


async def engine_empty(sim: EngineSim) -> None:
    """Wait for the signal that a paused request has left the engine."""
    await wait_until(
        lambda: sim.num_running + sim.num_waiting == 0, timeout_s=5, message="the engine empty"
    )


async def metric(http: aiohttp.ClientSession, sim: EngineSim, name: str) -> float:
    async with http.get(f"{sim.url}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} is not exposed")


def long_prompt(min_output: int) -> str:
    """A text prompt whose output without ignore_eos is at least min_output tokens long."""
    for number in range(1000):
        prompt = f"Tell me about slot number {number}, at length."
        if len(
            reference_output_ids(text_token_ids(prompt), 500, pseudo_eos_max_tokens=EOS_MAX)
        ) >= (min_output):
            return prompt
    raise AssertionError("no prompt found")


STREAM = {"stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}


@pytest.mark.parametrize(
    ("law", "pause_after"),
    [
        pytest.param({"ignore_eos": True, "max_tokens": 120}, 50, id="ignore-eos"),
        pytest.param({"max_tokens": 500}, 10, id="pseudo-eos"),
        pytest.param({"max_tokens": 500, "min_tokens": 80}, 30, id="min-tokens-reduced"),
    ],
)
async def test_a_paused_completion_resumed_equals_the_unpaused_one(
    sim: EngineSim, http: aiohttp.ClientSession, law: dict[str, Any], pause_after: int
) -> None:
    url = f"{sim.url}/v1/completions"
    body = {"model": MODEL, "prompt": long_prompt(20), **law, **STREAM}
    whole = await sse_chunks(http, url, body)
    assert whole[-1]["choices"] == []
    assert len(output_ids(whole)) > pause_after

    paused = await sse_chunks(http, url, body, pause_after_tokens=pause_after)
    await engine_empty(sim)
    prompt_ids = paused[0]["choices"][0]["prompt_token_ids"]
    generated = output_ids(paused)
    assert len(generated) == pause_after
    hits_before = await metric(http, sim, "vllm:prefix_cache_hits_total")
    resumed_body = {
        **body,
        "prompt": prompt_ids + generated,
        "max_tokens": law["max_tokens"] - pause_after,
        "min_tokens": max(0, law.get("min_tokens", 0) - pause_after),
    }
    resumed = await sse_chunks(http, url, resumed_body)

    assert generated + output_ids(resumed) == output_ids(whole)
    assert output_text(paused) + output_text(resumed) == output_text(whole)
    finish = [c["choices"][0]["finish_reason"] for c in whole if c["choices"]][-1]
    assert [c["choices"][0]["finish_reason"] for c in resumed if c["choices"]][-1] == finish
    assert resumed[-1]["usage"]["completion_tokens"] == len(output_ids(whole)) - pause_after
    # Every full block of the continuation's prompt but its last token was computed before.
    hits = await metric(http, sim, "vllm:prefix_cache_hits_total") - hits_before
    assert hits == (len(prompt_ids) + pause_after - 1) // BLOCK * BLOCK


async def test_a_paused_chat_resumed_through_completions_equals_the_unpaused_chat(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 90, "ignore_eos": True, **STREAM}
    chat_url = f"{sim.url}/v1/chat/completions"
    whole = await sse_chunks(http, chat_url, body)

    paused = await sse_chunks(http, chat_url, body, pause_after_tokens=25)
    await engine_empty(sim)
    prompt_ids = paused[0]["prompt_token_ids"]
    assert prompt_ids == list(chat_token_ids([("system", "Be brief."), ("user", "Hi!")]))
    generated = output_ids(paused)
    resumed = await sse_chunks(
        http,
        f"{sim.url}/v1/completions",
        {
            "model": MODEL,
            "prompt": prompt_ids + generated,
            "max_tokens": 90 - len(generated),
            "ignore_eos": True,
            **STREAM,
        },
    )

    assert generated + output_ids(resumed) == output_ids(whole)
    assert output_text(paused) + output_text(resumed) == output_text(whole)
    assert len(output_ids(whole)) == 90


async def test_distinct_prompts_get_no_cache_hit(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    for prompt in ("a" * 200, "b" * 200):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "ignore_eos": True}
        async with http.post(f"{sim.url}/v1/completions", json=body) as response:
            assert response.status == 200
    assert await metric(http, sim, "vllm:prefix_cache_queries_total") == 2 * 50
    assert await metric(http, sim, "vllm:prefix_cache_hits_total") == 0


# --- shapes ---------------------------------------------------------------------------------


async def post_json(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        reply: dict[str, Any] = await response.json()
        return reply


PROMPT = [11, 12, 13, 14, 15]
EXPECTED = reference_output_ids(PROMPT, 3, ignore_eos=True)
ENVELOPE_KEYS = {"id", "object", "created", "model"}


async def test_a_completion_returns_token_ids_as_vllm_does(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "ignore_eos": True}
    url = f"{sim.url}/v1/completions"

    asked = await post_json(http, url, {**body, "return_token_ids": True})
    plain = await post_json(http, url, body)

    (choice,) = asked["choices"]
    assert (choice["prompt_token_ids"], choice["token_ids"]) == (PROMPT, EXPECTED)
    assert choice["text"] == "".join(token_text(t) for t in EXPECTED)
    (choice,) = plain["choices"]
    assert (choice["prompt_token_ids"], choice["token_ids"]) == (None, None)
    assert "prompt_token_ids" not in plain

    chunks = await sse_chunks(http, url, {**body, **STREAM})
    first, second, third, usage = chunks
    assert first["choices"] == [
        {
            "index": 0,
            "text": token_text(EXPECTED[0]),
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
            "prompt_token_ids": PROMPT,
            "token_ids": [EXPECTED[0]],
        }
    ]
    assert set(first) == ENVELOPE_KEYS | {"choices"}  # no usage key unless continuous
    assert second["choices"][0]["prompt_token_ids"] is None  # on the first chunk only
    assert third["choices"][0]["token_ids"] == [EXPECTED[2]]
    assert third["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}

    unasked = await sse_chunks(http, url, {**body, "stream": True})
    assert all(
        (c["choices"][0]["prompt_token_ids"], c["choices"][0]["token_ids"]) == (None, None)
        for c in unasked
    )


async def test_a_chat_returns_token_ids_as_vllm_does(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    messages = [{"role": "user", "content": "hello"}]
    prompt_ids = list(chat_token_ids([("user", "hello")]))
    expected = reference_output_ids(prompt_ids, 3, ignore_eos=True)
    body = {"model": MODEL, "messages": messages, "max_tokens": 3, "ignore_eos": True}
    url = f"{sim.url}/v1/chat/completions"

    asked = await post_json(http, url, {**body, "return_token_ids": True})
    plain = await post_json(http, url, body)

    assert asked["prompt_token_ids"] == prompt_ids
    assert asked["choices"][0]["token_ids"] == expected
    assert asked["choices"][0]["message"]["content"] == "".join(token_text(t) for t in expected)
    assert (plain["prompt_token_ids"], plain["choices"][0]["token_ids"]) == (None, None)

    role, first, _, last, usage = await sse_chunks(http, url, {**body, **STREAM})
    assert role == {
        "id": role["id"],
        "object": "chat.completion.chunk",
        "created": role["created"],
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": prompt_ids,
        "prompt_text": None,
    }
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"content": token_text(expected[0])},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": [expected[0]],
        }
    ]
    assert set(first) == ENVELOPE_KEYS | {"choices"}
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["stop_reason"] is None
    assert last["choices"][0]["token_ids"] == [expected[2]]
    assert usage["usage"]["completion_tokens"] == 3

    role, first, *_ = await sse_chunks(http, url, {**body, "stream": True})
    assert role["prompt_token_ids"] is None
    assert first["choices"][0]["token_ids"] is None


async def test_cached_tokens_are_reported_only_with_prompt_tokens_details(
    http: aiohttp.ClientSession,
) -> None:
    for details in (False, True):
        emulator = EngineSim(config(enable_prompt_tokens_details=details))
        await emulator.start()
        try:
            url = f"{emulator.url}/v1/completions"
            body = {"model": MODEL, "prompt": list(range(40)), "max_tokens": 2, "ignore_eos": True}
            first = await post_json(http, url, body)
            again = await post_json(http, url, body)
            streamed = await sse_chunks(http, url, {**body, **STREAM})
        finally:
            await emulator.stop()
        if details:
            assert first["usage"]["prompt_tokens_details"] == {
                "cached_tokens": 0,
                "created_cache_tokens": None,
                "multimodal_tokens": None,
            }
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
            assert streamed[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
        else:
            assert again["usage"]["prompt_tokens_details"] is None
            assert "prompt_tokens_details" not in streamed[-1]["usage"]


async def test_a_chat_reports_the_tokens_it_wrote_to_the_cache(
    http: aiohttp.ClientSession,
) -> None:
    # As vLLM 0.32's chat does (its completions leave created_cache_tokens null).
    emulator = EngineSim(config(enable_prompt_tokens_details=True))
    await emulator.start()
    try:
        url = f"{emulator.url}/v1/chat/completions"
        messages = [{"role": "user", "content": "x" * 160}]  # 40 + 4 + 3 = 47 prompt tokens
        body = {"model": MODEL, "messages": messages, "max_tokens": 2, "ignore_eos": True}
        first = await post_json(http, url, body)
        again = await post_json(http, url, body)
        streamed = await sse_chunks(http, url, {**body, **STREAM})
    finally:
        await emulator.stop()

    assert first["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": 32,
        "multimodal_tokens": None,
    }
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert again["usage"]["prompt_tokens_details"]["created_cache_tokens"] == 0
    assert streamed[-1]["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 32,
        "created_cache_tokens": 0,
    }


# --- the budget witness ---------------------------------------------------------------------


async def test_the_high_water_gauge_holds_the_peak_until_reset(
    http: aiohttp.ClientSession,
) -> None:
    emulator = EngineSim(config(max_num_seqs=1))
    await emulator.start()
    try:
        body = {
            "model": MODEL,
            "prompt": "p",
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }
        responses = [await http.post(f"{emulator.url}/v1/completions", json=body) for _ in range(3)]
        await wait_until(
            lambda: emulator.num_running + emulator.num_waiting == 3,
            timeout_s=5,
            message="3 requests inside",
        )
        for response in responses:
            response.close()
        await engine_empty(emulator)

        # The engine is empty again, but the gauge kept what it held at its fullest.
        assert await metric(http, emulator, "slotshift_engine_peak_requests") == 3
        assert await metric(http, emulator, "slotshift_engine_aborted_requests_total") == 3
        async with http.post(f"{emulator.url}/sim/reset-peak") as response:
            assert response.status == 200
            assert await response.json() == {"peak": 3, "in_engine": 0}
        assert await metric(http, emulator, "slotshift_engine_peak_requests") == 0
        assert emulator.peak_in_server == 0
    finally:
        await emulator.stop()
