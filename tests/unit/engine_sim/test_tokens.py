"""The tokenizer-free approximation: ids, the next token and the pseudo-EOS are functions of
the text or the context, nothing else."""

from __future__ import annotations

import pytest

from engine_sim.tokens import (
    BATCH_MIN,
    CONTEXT_HASH_START,
    EOS_TOKEN_ID,
    VOCAB_SIZE,
    chat_token_ids,
    context_hash,
    count_chat_tokens,
    count_text_tokens,
    eos_sampled,
    eos_threshold,
    extend_hash,
    next_token_id,
    ordinary_chain,
    ordinary_chains,
    pseudo_eos_mean_tokens,
    sample_ordinary,
    synthetic_prompt_ids,
    text_token_ids,
    token_text,
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


def test_text_and_chat_ids_are_stable_and_as_many_as_counted() -> None:
    text = "Tell me about slots."
    assert text_token_ids(text) == text_token_ids(text)
    assert text_token_ids(text) != text_token_ids("Tell me about seats.")
    for sample in ("", "abc", "abcde", "x" * 401):
        assert len(text_token_ids(sample)) == count_text_tokens(sample)
    messages = [("system", "x" * 8), ("user", "y" * 17)]
    ids = chat_token_ids(messages)
    assert len(ids) == count_chat_tokens([text for _, text in messages])
    # The role is part of the prompt: the same words from another speaker are another prompt.
    assert chat_token_ids([("user", "hi")]) != chat_token_ids([("system", "hi")])
    assert ids[-3:] == chat_token_ids([("user", "z")])[-3:]  # the reply's opening


def test_the_context_hash_is_incremental() -> None:
    ids = list(range(40))
    assert context_hash(ids) == context_hash(ids[25:], context_hash(ids[:25]))
    assert context_hash(ids) == extend_hash(context_hash(ids[:-1]), ids[-1])
    assert context_hash(ids) != context_hash(ids[::-1])
    assert context_hash([0]) != CONTEXT_HASH_START  # a token of id 0 still counts


def test_next_tokens_are_ordinary_ids_with_filler_text() -> None:
    states = [context_hash([i]) for i in range(2000)]
    sampled = {next_token_id(state) for state in states}
    assert EOS_TOKEN_ID not in sampled
    assert all(0 <= token < VOCAB_SIZE for token in sampled)
    assert len(sampled) > 1900  # spread over the vocabulary
    assert all(token_text(token).startswith(" ") for token in sampled)
    assert token_text(EOS_TOKEN_ID) == ""


@pytest.mark.parametrize("mean", [1.0, 5.0, 512.5])
def test_the_pseudo_eos_is_drawn_with_probability_one_over_the_mean(mean: float) -> None:
    threshold = eos_threshold(mean)
    draws = [eos_sampled(context_hash([i, 7]), threshold) for i in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(1 / mean, rel=0.1, abs=0.001)


def test_the_eos_mean_is_the_former_uniform_laws() -> None:
    assert pseudo_eos_mean_tokens(1024) == 512.5
    assert pseudo_eos_mean_tokens(1) == 1.0
    with pytest.raises(ValueError, match="at least 1"):
        eos_threshold(0.5)


def test_synthetic_prompts_are_reproducible_and_distinct() -> None:
    assert synthetic_prompt_ids("a", 30) == synthetic_prompt_ids("a", 30)
    assert synthetic_prompt_ids("a", 30)[0] != synthetic_prompt_ids("b", 30)[0]
    assert len(synthetic_prompt_ids("a", 7)) == 7


@pytest.mark.parametrize(
    ("tokens", "count", "block_size"),
    [
        pytest.param(100, 0, 16, id="no-token"),
        pytest.param(100, 1, 16, id="one-token"),
        pytest.param(15, 1, 16, id="one-token-fills-a-block"),
        pytest.param(32, 70, 16, id="from-a-boundary-over-four-blocks"),
        pytest.param(7, 50, 1, id="every-token-fills-a-block"),
        pytest.param(1000, 333, 3, id="odd-block-size"),
    ],
)
def test_the_ordinary_chain_is_token_after_token(tokens: int, count: int, block_size: int) -> None:
    start = context_hash(range(tokens))
    state, expected_keys = start, []
    for position in range(tokens + 1, tokens + count + 1):
        state = extend_hash(state, next_token_id(state))
        if position % block_size == 0:
            expected_keys.append(state)
    keys = [1, 2]  # appended to, not replaced
    assert ordinary_chain(start, count, tokens, block_size, keys) == state
    assert keys == [1, 2, *expected_keys]


@pytest.mark.parametrize("contexts", [1, BATCH_MIN - 1, BATCH_MIN, 100])
@pytest.mark.parametrize("count", [0, 1, 17, 40])
def test_a_batch_of_chains_is_each_chain(contexts: int, count: int) -> None:
    """ordinary_chains and sample_ordinary give, below and from BATCH_MIN contexts on (the
    arrays' path), what ordinary_chain, next_token_id and extend_hash give one by one; the
    hashes include the largest (2^61 - 2) and those that straddle 32 bits."""
    edges = [(1 << 61) - 2, (1 << 32) - 1, 1 << 32, 0]
    states = [*edges, *(context_hash(range(n)) for n in range(contexts))][:contexts]
    tokens = [3 * n + 1 for n in range(contexts)]
    expected_keys: list[list[int]] = [[] for _ in states]
    expected = [
        ordinary_chain(state, count, held, 16, keys)
        for state, held, keys in zip(states, tokens, expected_keys, strict=True)
    ]
    keys: list[list[int]] = [[] for _ in states]
    assert ordinary_chains(states, count, tokens, 16, keys) == expected
    assert keys == expected_keys
    ids, extended = sample_ordinary(states)
    assert ids == [next_token_id(s) for s in states]
    assert extended == [extend_hash(s, t) for s, t in zip(states, ids, strict=True)]
