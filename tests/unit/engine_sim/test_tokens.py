"""The tokenizer-free approximation: counts, filler text and the pseudo-EOS are deterministic."""

from __future__ import annotations

import pytest

from engine_sim.tokens import (
    count_chat_tokens,
    count_text_tokens,
    filler_token,
    pseudo_eos_position,
    seed_of,
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        pytest.param("", 1, id="empty-counts-one"),
        pytest.param("abc", 1, id="short"),
        pytest.param("abcd", 1, id="four-chars"),
        pytest.param("abcde", 2, id="rounds-up"),
        pytest.param("x" * 400, 100, id="long"),
    ],
)
def test_text_counts_a_token_per_four_characters(text: str, tokens: int) -> None:
    assert count_text_tokens(text) == tokens


def test_chat_adds_template_tokens_per_message_and_for_the_reply() -> None:
    assert count_chat_tokens(["x" * 40]) == 10 + 4 + 3
    assert count_chat_tokens(["x" * 40, "y" * 8]) == (10 + 4) + (2 + 4) + 3


def test_the_same_prompt_gives_the_same_seed_text_and_stop() -> None:
    seed = seed_of("Tell me about slots.")
    assert seed == seed_of("Tell me about slots.")
    assert seed != seed_of("Tell me about seats.")
    assert [filler_token(seed, i) for i in range(5)] == [filler_token(seed, i) for i in range(5)]
    assert all(filler_token(seed, i).startswith(" ") for i in range(40))


def test_pseudo_eos_falls_between_one_and_the_maximum() -> None:
    positions = {pseudo_eos_position(seed_of(f"prompt {i}"), 64) for i in range(2000)}
    assert min(positions) == 1
    assert max(positions) == 64
