"""The emulator over real HTTP on port 0: aiohttp's client and the official openai client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from engine_sim.metrics import (
    INTER_TOKEN_LATENCY_BUCKETS_S,
    REQUEST_LATENCY_BUCKETS_S,
    TTFT_BUCKETS_S,
)
from engine_sim.server import EngineSim
from engine_sim.tokens import (
    chat_token_ids,
    reference_output_ids,
    text_token_ids,
    token_text,
)
from tests.support import wait_until
from tests.unit.engine_sim.conftest import MODEL, fast_config

LABELS = {"model_name": MODEL, "engine": "0"}


def expected_text(prompt_ids: tuple[int, ...], max_tokens: int, **law: Any) -> str:
    """The text the emulator generates for these prompt ids (fast_config's EOS law)."""
    ids = reference_output_ids(prompt_ids, max_tokens, pseudo_eos_max_tokens=20, **law)
    return "".join(token_text(token_id) for token_id in ids)


@pytest_asyncio.fixture
async def client(sim: EngineSim) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0) as oai:
        yield oai


async def read_sse(response: aiohttp.ClientResponse) -> list[str]:
    """The data fields of a server-sent event stream, checking its framing on the way."""
    body = (await response.read()).decode()
    events = body.split("\n\n")
    assert events[-1] == ""  # the stream ends with a complete event
    data: list[str] = []
    for event in events[:-1]:
        assert event.startswith("data: "), event
        data.append(event.removeprefix("data: "))
    return data


async def test_a_completion_has_vllms_shape_and_exact_usage(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    body = {"model": MODEL, "prompt": "x" * 40, "max_tokens": 7, "ignore_eos": True}
    async with http.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        reply = await response.json()

    assert reply["id"].startswith("cmpl-")
    assert reply["object"] == "text_completion"
    assert reply["model"] == MODEL
    assert isinstance(reply["created"], int)
    (choice,) = reply["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "length"
    assert choice["text"] == expected_text(text_token_ids("x" * 40), 7, ignore_eos=True)
    assert (choice["token_ids"], choice["prompt_token_ids"]) == (None, None)  # not asked
    assert reply["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "total_tokens": 17,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert sim.completed_count == 1


async def test_the_openai_client_reads_completions_and_chat(client: openai.AsyncOpenAI) -> None:
    completion = await client.completions.create(
        model=MODEL, prompt="hello there", max_tokens=5, extra_body={"ignore_eos": True}
    )
    chat = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x" * 20}],
        max_completion_tokens=4,
        extra_body={"ignore_eos": True},
    )

    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 5)
    assert completion.choices[0].finish_reason == "length"
    assert chat.id.startswith("chatcmpl-")
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == expected_text(
        chat_token_ids([("user", "x" * 20)]), 4, ignore_eos=True
    )
    assert chat.usage is not None
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (5 + 4 + 3, 4)


async def test_a_completion_stream_sends_one_chunk_per_token_then_usage(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.completions.create(
        model=MODEL,
        prompt="stream me",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]

    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(token_chunks) == 6
    assert all(c.object == "text_completion" and len(c.choices) == 1 for c in token_chunks)
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 5 + ["length"]
    assert len({c.id for c in chunks}) == 1
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (3, 6)


async def test_a_chat_stream_opens_with_the_role_and_closes_with_the_reason(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]

    assert [c.object for c in chunks] == ["chat.completion.chunk"] * 5
    opening, *tokens, usage_chunk = chunks
    assert opening.choices[0].delta.role == "assistant"
    assert opening.choices[0].delta.content == ""
    assert "".join(str(c.choices[0].delta.content) for c in tokens) == expected_text(
        chat_token_ids([("user", "hi")]), 3, ignore_eos=True
    )
    assert [c.choices[0].finish_reason for c in tokens] == [None, None, "length"]
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 3


async def test_sse_framing_ends_with_done_and_has_no_usage_unless_asked(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "abc", "max_tokens": 2, "stream": True, "ignore_eos": True}
    async with http.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        data = await read_sse(response)

    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len(chunks) == 2
    assert not any("usage" in chunk for chunk in chunks)  # vLLM 0.32 leaves it unset


async def test_without_ignore_eos_a_request_stops_at_its_pseudo_eos(
    client: openai.AsyncOpenAI,
) -> None:
    prompt = "When will I stop?"
    expected = reference_output_ids(text_token_ids(prompt), 100, pseudo_eos_max_tokens=20)

    first = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=100)
    again = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=100)

    assert len(expected) < 100  # the law stops this prompt early (mean 10.5)
    assert first.usage is not None
    assert first.usage.completion_tokens == len(expected)
    assert first.choices[0].finish_reason == "stop"
    assert first.choices[0].text == expected_text(text_token_ids(prompt), 100)
    assert again.choices[0].text == first.choices[0].text


async def test_errors_have_vllms_shape_and_status(
    sim: EngineSim, http: aiohttp.ClientSession, client: openai.AsyncOpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        await client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert not_found.value.body == {
        "message": "The model `no-such-model` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    with pytest.raises(openai.BadRequestError, match="maximum context length is 2048"):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5000
        )
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        await client.completions.create(model=MODEL, prompt="x", n=2)

    async with http.post(
        f"{sim.url}/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert sim.num_running + sim.num_waiting == 0


async def test_models_health_and_version(
    sim: EngineSim, http: aiohttp.ClientSession, client: openai.AsyncOpenAI
) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "vllm"
    async with http.get(f"{sim.url}/v1/models") as response:
        (card,) = (await response.json())["data"]
    assert card["max_model_len"] == 2048
    assert card["root"] == MODEL

    async with http.get(f"{sim.url}/health") as response:
        assert response.status == 200
    async with http.get(f"{sim.url}/version") as response:
        assert isinstance((await response.json())["version"], str)


def samples_of(text: str) -> dict[str, tuple[str, list[Sample]]]:
    return {
        family.name: (family.type, family.samples)
        for family in text_string_to_metric_families(text)
    }


def value_of(samples: list[Sample], name: str, **labels: str) -> float:
    wanted = {**LABELS, **labels}
    matching = [s.value for s in samples if s.name == name and s.labels == wanted]
    assert len(matching) == 1, (name, wanted, samples)
    return matching[0]


async def test_metrics_have_vllms_v1_names_types_labels_and_buckets(
    sim: EngineSim, http: aiohttp.ClientSession, client: openai.AsyncOpenAI
) -> None:
    await client.completions.create(
        model=MODEL, prompt="x" * 40, max_tokens=5, extra_body={"ignore_eos": True}
    )
    async with http.get(f"{sim.url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        families = samples_of(await response.text())

    expected_types = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "slotshift_sim_gpu_utilization_percent": "gauge",
        "slotshift_sim_gpu_memory_used_bytes": "gauge",
        "slotshift_sim_gpu_memory_total_bytes": "gauge",
        "slotshift_engine_peak_requests": "gauge",
        "slotshift_engine_aborted_requests": "counter",
    }
    assert {name: families[name][0] for name in expected_types} == expected_types
    for _, family_samples in families.values():
        for sample in family_samples:
            assert {k: v for k, v in sample.labels.items() if k in LABELS} == LABELS

    def samples(name: str) -> list[Sample]:
        return families[name][1]

    assert value_of(samples("vllm:prompt_tokens"), "vllm:prompt_tokens_total") == 10
    assert value_of(samples("vllm:generation_tokens"), "vllm:generation_tokens_total") == 5
    assert value_of(samples("vllm:num_preemptions"), "vllm:num_preemptions_total") == 0
    queries = samples("vllm:prefix_cache_queries")
    assert value_of(queries, "vllm:prefix_cache_queries_total") == 10
    assert value_of(samples("vllm:prefix_cache_hits"), "vllm:prefix_cache_hits_total") == 0
    peak = samples("slotshift_engine_peak_requests")
    assert value_of(peak, "slotshift_engine_peak_requests") == 1
    success = samples("vllm:request_success")
    for reason, count in (("length", 1), ("stop", 0), ("abort", 0)):
        assert value_of(success, "vllm:request_success_total", finished_reason=reason) == count
    for name, count in (
        ("vllm:time_to_first_token_seconds", 1),
        ("vllm:inter_token_latency_seconds", 4),
        ("vllm:e2e_request_latency_seconds", 1),
        ("vllm:request_queue_time_seconds", 1),
    ):
        assert value_of(samples(name), f"{name}_count") == count
    for name, buckets in (
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS_S),
        ("vllm:inter_token_latency_seconds", INTER_TOKEN_LATENCY_BUCKETS_S),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS_S),
    ):
        bounds = [s.labels["le"] for s in samples(name) if s.name == f"{name}_bucket"]
        assert bounds == [str(float(b)) for b in buckets] + ["+Inf"]
    assert TTFT_BUCKETS_S[:3] == (0.001, 0.005, 0.01)
    assert REQUEST_LATENCY_BUCKETS_S[-1] == 7680.0

    assert value_of(samples("vllm:num_requests_running"), "vllm:num_requests_running") == 0
    assert value_of(samples("vllm:kv_cache_usage_perc"), "vllm:kv_cache_usage_perc") == 0
    utilization = value_of(
        samples("slotshift_sim_gpu_utilization_percent"), "slotshift_sim_gpu_utilization_percent"
    )
    assert 0 < utilization <= 100  # the steps just run fall inside the 1 s window
    profile = sim.profile
    assert (
        value_of(
            samples("slotshift_sim_gpu_memory_used_bytes"), "slotshift_sim_gpu_memory_used_bytes"
        )
        == profile.model_weights_bytes
    )
    assert (
        value_of(
            samples("slotshift_sim_gpu_memory_total_bytes"), "slotshift_sim_gpu_memory_total_bytes"
        )
        == profile.gpu_memory_total_bytes
    )


async def test_help_texts_say_the_gpu_gauges_are_emulated(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{sim.url}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        if family.name.startswith("slotshift_sim_gpu_"):
            assert "Emulated" in family.documentation


async def test_a_stream_whose_client_disconnects_is_aborted(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "long", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    response = await http.post(f"{sim.url}/v1/completions", json=body)
    assert (await response.content.readline()).startswith(b"data: ")
    assert sim.num_running == 1

    response.close()

    await wait_until(lambda: sim.num_running == 0, timeout_s=5, message="the request aborted")
    assert sim.aborted_count == 1
    assert sim.engine.core.used_blocks == 0
    # As in vLLM 0.32: the aborted request is in the token counters, in no request metric.
    async with http.get(f"{sim.url}/metrics") as metrics:
        families = samples_of(await metrics.text())
    generated = families["vllm:generation_tokens"][1]
    assert value_of(generated, "vllm:generation_tokens_total") >= 1
    success = families["vllm:request_success"][1]
    for reason in ("abort", "length", "stop"):
        assert value_of(success, "vllm:request_success_total", finished_reason=reason) == 0
    e2e = families["vllm:e2e_request_latency_seconds"][1]
    assert value_of(e2e, "vllm:e2e_request_latency_seconds_count") == 0


async def test_a_plain_request_whose_client_disconnects_is_aborted(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "long", "max_tokens": 2000, "ignore_eos": True}
    request = asyncio.create_task(http.post(f"{sim.url}/v1/completions", json=body))
    await wait_until(lambda: sim.num_running == 1, timeout_s=5, message="the request running")

    request.cancel()  # closes the connection while the server is still generating
    with pytest.raises(asyncio.CancelledError):
        await request

    await wait_until(lambda: sim.num_running == 0, timeout_s=5, message="the request aborted")
    assert sim.aborted_count == 1
    assert sim.completed_count == 0


async def test_requests_beyond_max_num_seqs_wait_inside_the_server(
    http: aiohttp.ClientSession,
) -> None:
    emulator = EngineSim(fast_config(max_num_seqs=2))
    await emulator.start()
    try:
        body = {"prompt": "p", "max_tokens": 2000, "ignore_eos": True}
        requests = [
            asyncio.create_task(http.post(f"{emulator.url}/v1/completions", json=body))
            for _ in range(5)
        ]
        await wait_until(
            lambda: (emulator.num_running, emulator.num_waiting) == (2, 3),
            timeout_s=5,
            message="2 running and 3 waiting",
        )
        assert emulator.peak_in_server == 5
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
        await wait_until(
            lambda: emulator.num_running + emulator.num_waiting == 0,
            timeout_s=5,
            message="all aborted",
        )
        assert emulator.aborted_count == 5
        emulator.reset_peak()
        assert emulator.peak_in_server == 0
    finally:
        await emulator.stop()


async def test_stop_aborts_what_the_grace_period_does_not_finish(
    http: aiohttp.ClientSession,
) -> None:
    emulator = EngineSim(fast_config(shutdown_grace_s=0.1))
    await emulator.start()
    body = {"prompt": "long", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    response = await http.post(f"{emulator.url}/v1/completions", json=body)
    await response.content.readline()

    await emulator.stop()

    assert emulator.num_running == 0
    assert emulator.aborted_count == 1
    with pytest.raises(aiohttp.ClientError):
        await http.get(f"{emulator.url}/health")
    response.close()


async def test_tokenize_gives_the_ids_a_completion_of_the_prompt_sees(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    prompt = "the batch job summarises a long report"
    async with http.post(f"{sim.url}/tokenize", json={"model": MODEL, "prompt": prompt}) as r:
        assert r.status == 200
        tokenized = await r.json()
    assert tokenized == {
        "count": len(text_token_ids(prompt)),
        "max_model_len": fast_config().max_model_len,
        "tokens": list(text_token_ids(prompt)),
        "token_strs": None,
    }
    # The same answer for the text and for its ids (a gateway may send either).
    answers = []
    for form in (prompt, tokenized["tokens"]):
        body = {"model": MODEL, "prompt": form, "max_tokens": 5, "ignore_eos": True}
        async with http.post(f"{sim.url}/v1/completions", json=body) as response:
            answers.append((await response.json())["choices"][0]["text"])
    assert answers[0] == answers[1]
    async with http.post(f"{sim.url}/tokenize", json={"model": "other", "prompt": "x"}) as r:
        assert r.status == 404


async def test_tokenize_counts_chat_messages_as_a_chat_completion_of_them_does(
    sim: EngineSim, http: aiohttp.ClientSession
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is a slot?"}]},
    ]
    async with http.post(f"{sim.url}/tokenize", json={"model": MODEL, "messages": messages}) as r:
        assert r.status == 200
        count = (await r.json())["count"]
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    async with http.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        assert count == (await response.json())["usage"]["prompt_tokens"]
    async with http.post(f"{sim.url}/tokenize", json={"messages": "not a list"}) as r:
        assert r.status == 400
