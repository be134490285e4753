"""Request validation as vLLM answers it, without a server."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import pytest

from engine_sim.openai_api import (
    ApiError,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from engine_sim.tokens import chat_token_ids, text_token_ids
from slotshift.config import EngineSimConfig

CONFIG = EngineSimConfig(model_name="m", max_model_len=1024, default_max_tokens=256)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        pytest.param({"prompt": "x", "model": "other"}, 404, "model", id="unknown-model"),
        pytest.param({"prompt": "x", "n": 2}, 400, "n", id="n-above-one"),
        pytest.param({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", id="zero-max-tokens"),
        pytest.param({"prompt": "x", "max_tokens": "9"}, 400, "max_tokens", id="max-tokens-text"),
        pytest.param({"prompt": "x", "max_tokens": True}, 400, "max_tokens", id="max-tokens-bool"),
        pytest.param({"prompt": "x", "stream": "yes"}, 400, "stream", id="stream-not-bool"),
        pytest.param({"prompt": "x", "ignore_eos": 1}, 400, "ignore_eos", id="ignore-eos-int"),
        pytest.param({}, 400, "prompt", id="no-prompt"),
        pytest.param({"prompt": ["a", "b"]}, 400, "prompt", id="two-prompts"),
        pytest.param({"prompt": 5}, 400, "prompt", id="prompt-number"),
        pytest.param(
            {"prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "stream_options",
            id="stream-options-without-stream",
        ),
        pytest.param({"prompt": "x", "max_tokens": 1024}, 400, None, id="beyond-max-model-len"),
        pytest.param({"prompt": "x" * 4096}, 400, None, id="prompt-fills-the-context"),
        pytest.param({"prompt": "x", "min_tokens": "2"}, 400, "min_tokens", id="min-tokens-text"),
        pytest.param({"prompt": "x", "min_tokens": -1}, 400, None, id="negative-min-tokens"),
        pytest.param(
            {"prompt": "x", "max_tokens": 3, "min_tokens": 4}, 400, None, id="min-above-max"
        ),
        pytest.param(
            {"prompt": "x", "return_token_ids": "yes"},
            400,
            "return_token_ids",
            id="return-token-ids-not-bool",
        ),
    ],
)
def test_bad_completion_requests_get_vllm_errors(
    body: dict[str, Any], status: int, param: str | None
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_completion_request(body, CONFIG)

    error = caught.value.body()["error"]
    assert caught.value.status == status
    assert error["code"] == status
    assert error["param"] == param
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert error["message"]


def test_the_context_length_error_names_both_sides() -> None:
    with pytest.raises(ApiError, match=r"maximum context length is 1024 tokens.*1025 tokens"):
        parse_completion_request({"prompt": "abcd", "max_tokens": 1024}, CONFIG)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({}, "messages", id="no-messages"),
        pytest.param({"messages": []}, "messages", id="empty"),
        pytest.param({"messages": [{"content": "x"}]}, "messages", id="no-role"),
        pytest.param(
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages",
            id="image-part",
        ),
        pytest.param({"messages": [{"role": "user", "content": 3}]}, "messages", id="bad-content"),
    ],
)
def test_bad_chat_requests_get_400(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body, CONFIG)
    assert caught.value.status == HTTPStatus.BAD_REQUEST
    assert caught.value.param == param


def test_a_completion_request_with_defaults() -> None:
    request = parse_completion_request({"model": "m", "prompt": "x" * 40}, CONFIG)

    assert request.prompt_tokens == 10
    assert request.prompt_token_ids == text_token_ids("x" * 40)
    assert request.max_tokens == 16  # vLLM's CompletionRequest default
    assert (request.stream, request.ignore_eos, request.include_usage) == (False, False, False)
    assert (request.min_tokens, request.return_token_ids) == (0, False)


def test_token_ids_are_kept_and_min_tokens_and_return_token_ids_are_read() -> None:
    request = parse_completion_request(
        {"prompt": [9, 0, 31999, 7], "max_tokens": 5, "min_tokens": 5, "return_token_ids": True},
        CONFIG,
    )
    assert request.prompt_token_ids == (9, 0, 31999, 7)
    assert (request.min_tokens, request.return_token_ids) == (5, True)


def test_the_min_tokens_error_is_vllms() -> None:
    with pytest.raises(
        ApiError, match=r"^min_tokens must be less than or equal to max_tokens=3, got 4\.$"
    ):
        parse_completion_request({"prompt": "x", "max_tokens": 3, "min_tokens": 4}, CONFIG)


def test_a_null_max_tokens_is_the_default_capped_by_the_room_left_in_the_context() -> None:
    request = parse_completion_request({"prompt": "x" * 4000, "max_tokens": None}, CONFIG)
    assert request.max_tokens == 1024 - 1000
    assert parse_completion_request({"prompt": "x", "max_tokens": None}, CONFIG).max_tokens == 256


def test_a_completion_without_max_tokens_gets_vllms_16() -> None:
    assert parse_completion_request({"prompt": "x"}, CONFIG).max_tokens == 16


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        pytest.param([1, 2, 3], 3, id="token-ids"),
        pytest.param([[1, 2, 3, 4]], 4, id="one-list-of-token-ids"),
        pytest.param(["abcdefgh"], 2, id="one-string-in-a-list"),
    ],
)
def test_prompt_forms(prompt: object, tokens: int) -> None:
    assert parse_completion_request({"prompt": prompt}, CONFIG).prompt_tokens == tokens


def test_stream_options_turn_on_usage_and_continuous_usage() -> None:
    given = parse_completion_request(
        {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}}, CONFIG
    )
    assert (given.include_usage, given.continuous_usage) == (True, True)
    declined = parse_completion_request(
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": False}}, CONFIG
    )
    assert (declined.include_usage, declined.continuous_usage) == (False, False)


def test_chat_prefers_max_completion_tokens_and_counts_the_template() -> None:
    request = parse_chat_request(
        {
            "messages": [
                {"role": "system", "content": "x" * 8},
                {"role": "user", "content": [{"type": "text", "text": "y" * 16}]},
            ],
            "max_tokens": 50,
            "max_completion_tokens": 7,
            "ignore_eos": True,
        },
        CONFIG,
    )
    assert request.max_tokens == 7
    assert request.prompt_tokens == (2 + 4) + (4 + 4) + 3
    assert request.prompt_token_ids == chat_token_ids([("system", "x" * 8), ("user", "y" * 16)])
    assert request.ignore_eos


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"{", id="truncated"),
        pytest.param(b"[1]", id="array"),
        pytest.param(b"\xff", id="binary"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_a_400(raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        parse_json_body(raw)
    assert caught.value.status == HTTPStatus.BAD_REQUEST
