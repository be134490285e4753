"""The bench's upstream: vLLM's shapes, the token ids and usage the resume relay reads, pacing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from admission_gateway.resume import Resumption, SseDecoder, is_done
from slotshift_tools.gateway_bench.measure import EventCounter
from slotshift_tools.gateway_bench.upstream import (
    TOKEN_ID,
    parse_generation,
    serve,
    text_prompt_ids,
)
from slotshift_tools.local_stack import free_ports


def test_an_event_end_split_across_reads_is_counted_once() -> None:
    counter = EventCounter()
    for chunk in (b"data: 1\n", b"\ndata: 2\n\nda", b"ta: 3\n\n", b""):
        counter.feed(chunk)
    assert counter.events == 3


def test_a_request_shape_is_read_as_vllm_reads_it() -> None:
    generation = parse_generation(
        "/v1/completions",
        {
            "prompt": [5, 6],
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert (generation.max_tokens, generation.with_ids, generation.include_usage) == (
        16,
        True,
        True,
    )
    assert generation.prompt_ids == [5, 6]
    chat = parse_generation(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 3}
    )
    assert chat.chat and not chat.stream and chat.max_tokens == 3
    assert chat.prompt_ids == text_prompt_ids("a b")
    with pytest.raises(ValueError, match="prompt"):
        parse_generation("/v1/completions", {"prompt": [], "max_tokens": 1})


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    async with session.post(url, json=body) as response:
        assert response.status == 200
        return await response.read()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_stream_carries_what_the_resume_relay_reads(path: str) -> None:
    [port] = free_ports(1)
    stop = asyncio.Event()
    server = asyncio.create_task(serve("127.0.0.1", port, 2000.0, stop), name="upstream")
    url = f"http://127.0.0.1:{port}"
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "hi there"}]}
        if path.endswith("chat/completions")
        else {"prompt": "hi there"}
    )
    body.update(max_tokens=5, stream=True)
    try:
        async with aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10.0
            while True:
                try:
                    await _post(session, f"{url}/tokenize", {"prompt": "x"})
                    break
                except aiohttp.ClientConnectionError:
                    assert loop.time() < deadline, "the upstream never served"
                    await asyncio.sleep(0.01)
            resumption = Resumption(path, body)
            upstream_path, upstream_body = resumption.upstream_request()
            started = loop.time()
            raw = await _post(session, url + upstream_path, json.loads(upstream_body))
            elapsed = loop.time() - started
            decoder = SseDecoder()
            payloads = decoder.feed(raw)
            for index, payload in enumerate(payloads):
                if not is_done(payload):
                    resumption.feed(payload)
                if index == 1:
                    # The prompt's and the output's ids are known: a pause here resumes exactly.
                    assert resumption.pausable()
            assert is_done(payloads[-1])
            assert resumption.generated_tokens == 5
            assert resumption.prompt_tokens == len(text_prompt_ids("hi there"))
            tokens = [json.loads(p) for p in payloads if not is_done(p)]
            usage = tokens[-1]["usage"]
            assert usage["completion_tokens"] == 5
            assert TOKEN_ID in tokens[-2]["choices"][0]["token_ids"]
            # 4 intervals of 0.5 ms after the first token, at least.
            assert elapsed >= 0.002
            plain = await _post(session, f"{url}/v1/completions", {"prompt": "a", "max_tokens": 4})
            assert json.loads(plain)["usage"]["completion_tokens"] == 4
            models = await (await session.get(f"{url}/v1/models")).json()
            assert models["data"][0]["id"]
    finally:
        stop.set()
        await server
