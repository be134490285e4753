"""A request's cost in slots: the prompt's estimate, the charged max_tokens, the rounding."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from admission_gateway.request_cost import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    prompt_size,
    request_cost,
)
from slotshift.config import RequestCostConfig

CONFIG = RequestCostConfig(tokens_per_slot=100, max_model_len_tokens=4096)


@pytest.mark.parametrize(
    ("document", "prompt_tokens", "max_tokens", "slots", "estimated_by"),
    [
        pytest.param({"prompt": "x" * 400, "max_tokens": 100}, 100, 100, 2, "length", id="text"),
        pytest.param(
            {"prompt": "x" * 401, "max_tokens": 100}, 101, 100, 3, "length", id="round-up"
        ),
        pytest.param({"prompt": [1, 2, 3], "max_tokens": 7}, 3, 7, 1, "token_ids", id="ids"),
        pytest.param(
            {"prompt": "x" * 40},
            10,
            COMPLETIONS_DEFAULT_MAX_TOKENS,
            1,
            "length",
            id="completion-without-max-tokens-gets-vllm-default",
        ),
        pytest.param(
            {"prompt": "x" * 400, "max_tokens": None},
            100,
            3996,
            41,
            "length",
            id="completion-null-max-tokens-gets-the-context",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "x" * 400}]},
            100,
            3996,
            41,
            "length",
            id="chat-without-max-tokens-gets-the-context",
        ),
        pytest.param(
            {
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 200}]}],
                "max_tokens": 9999,
                "max_completion_tokens": 50,
            },
            50,
            50,
            1,
            "length",
            id="chat-parts-max-completion-tokens-wins",
        ),
        pytest.param(
            {"prompt": "x" * 400, "max_tokens": 100, "n": 3}, 100, 100, 4, "length", id="n"
        ),
        pytest.param(
            {"prompt": ["x" * 400, [1] * 100], "max_tokens": 100},
            200,
            100,
            4,
            "length",
            id="batch-of-text-and-ids",
        ),
        pytest.param(
            {"prompt": "x" * 40000, "max_tokens": 100}, 10000, 1, 41, "length", id="over-context"
        ),
        pytest.param({"prompt": 5, "max_tokens": 0}, 0, 4096, 41, "token_ids", id="malformed"),
    ],
)
def test_cost_of_request_shapes(
    document: dict[str, Any], prompt_tokens: int, max_tokens: int, slots: int, estimated_by: str
) -> None:
    cost = request_cost(document, CONFIG)
    assert (cost.prompt_tokens, cost.max_tokens, cost.slots, cost.estimated_by) == (
        prompt_tokens,
        max_tokens,
        slots,
        estimated_by,
    )


def test_the_engines_count_replaces_the_length_estimate_and_a_failure_is_labelled() -> None:
    document = {"prompt": "x" * 400, "max_tokens": 100}
    counted = request_cost(document, CONFIG, counted_prompt_tokens=250)
    assert (counted.prompt_tokens, counted.slots, counted.estimated_by) == (250, 4, "tokenize")
    fallback = request_cost(document, CONFIG, tokenize_failed=True)
    assert (fallback.prompt_tokens, fallback.estimated_by) == (100, "length_fallback")


def test_chars_per_token_sets_the_length_estimate() -> None:
    config = RequestCostConfig(tokens_per_slot=10, max_model_len_tokens=1000, chars_per_token=2.5)
    assert request_cost({"prompt": "x" * 25, "max_tokens": 1}, config).prompt_tokens == 10


def test_what_one_tokenize_call_can_count() -> None:
    assert prompt_size({"prompt": "hi"}).tokenizable == {"prompt": "hi"}
    assert prompt_size({"prompt": ["hi"]}).tokenizable == {"prompt": "hi"}
    assert prompt_size({"prompt": ["hi", "there"]}).tokenizable is None
    assert prompt_size({"prompt": [1, 2]}).tokenizable is None
    messages = [{"role": "user", "content": "hi"}]
    assert prompt_size({"messages": messages}).tokenizable == {"messages": messages}


def test_a_slot_larger_than_the_context_is_refused() -> None:
    with pytest.raises(ValidationError, match="tokens_per_slot"):
        RequestCostConfig(tokens_per_slot=5000, max_model_len_tokens=4096)


configs = st.builds(
    lambda per_slot, extra, chars: RequestCostConfig(
        tokens_per_slot=per_slot, max_model_len_tokens=per_slot + extra, chars_per_token=chars
    ),
    st.integers(1, 2048),
    st.integers(0, 32768),
    st.floats(0.5, 8.0),
)
max_tokens = st.one_of(st.none(), st.integers(1, 100_000))


def completion(text_chars: int, asked: int | None, *, chat: bool) -> dict[str, Any]:
    if chat:
        return {"messages": [{"role": "user", "content": "x" * text_chars}], "max_tokens": asked}
    return {"prompt": "x" * text_chars, "max_tokens": asked}


@given(configs, st.integers(0, 50_000), max_tokens, st.booleans())
def test_every_request_costs_at_least_one_slot_and_at_most_the_context(
    config: RequestCostConfig, chars: int, asked: int | None, chat: bool
) -> None:
    cost = request_cost(completion(chars, asked, chat=chat), config)
    most = -(-config.max_model_len_tokens // config.tokens_per_slot)
    assert 1 <= cost.slots <= most


@given(configs, st.integers(0, 50_000), st.integers(1, 100_000), st.integers(0, 100_000))
def test_the_cost_never_falls_as_max_tokens_grows(
    config: RequestCostConfig, chars: int, asked: int, more: int
) -> None:
    for chat in (False, True):
        low = request_cost(completion(chars, asked, chat=chat), config)
        high = request_cost(completion(chars, asked + more, chat=chat), config)
        unbounded = request_cost(completion(chars, None, chat=chat), config)
        assert low.slots <= high.slots <= unbounded.slots


@given(configs, st.integers(0, 50_000), st.integers(0, 50_000), max_tokens)
def test_the_cost_never_falls_as_the_prompt_grows(
    config: RequestCostConfig, chars: int, more: int, asked: int | None
) -> None:
    for chat in (False, True):
        short = request_cost(completion(chars, asked, chat=chat), config)
        long = request_cost(completion(chars + more, asked, chat=chat), config)
        assert short.slots <= long.slots
