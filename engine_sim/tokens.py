"""Tokens without a tokenizer: deterministic ids, a context-driven next token and a pseudo-EOS.

The emulator must answer the same request the same way every time, count tokens roughly as a real
BPE tokenizer would without loading one, and continue a request exactly: a request whose prompt is
another's prompt plus the tokens it generated must generate what that other would have generated
next (a paused request is resumed that way). Hence every output is a function of the context:
- a text has ceil(characters / 4) tokens, at least 1 (English averages about 4 characters per
  token under the common BPE vocabularies): one id per 4-character chunk, from the chunk's CRC-32;
- a chat conversation is each message's template tokens (a message start, its role, a newline,
  then its text, then a message end: CHAT_TOKENS_PER_MESSAGE around the text) and the template
  tokens that open the assistant's reply (CHAT_TOKENS_FOR_REPLY), as ChatML-style templates are;
- the context (prompt ids, then each output id as it is sampled) is folded into a polynomial
  rolling hash modulo the Mersenne prime 2^61 - 1; the next token is a mix of that hash, modulo
  the vocabulary. Being incremental, the hash of prompt + output equals the hash of a prompt that
  is the two joined, so a continuation samples the same tokens;
- without ignore_eos, each sampled token is the pseudo-EOS with probability 1 / mean (a second mix
  of the same hash, so also a function of the context), but never before `min_tokens` output
  tokens. The output length is then geometric (memoryless: a continuation cannot know how long the
  request already ran) with mean pseudo_eos_mean_tokens(max) = (max + 1) / 2, the mean of the
  uniform 1..max law the emulator used before. The EOS token counts as an output token and has no
  text, as in vLLM;
- a token's text is a short filler word chosen by its id (the EOS's is empty).

The same hash, taken at each full KV block's boundary, names that block for the prefix cache
(engine_sim/engine_core.py): two contexts share a cached block exactly when they share every token
up to its end.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

CHARS_PER_TOKEN = 4
"""Characters one token stands for in the approximation."""

CHAT_TOKENS_PER_MESSAGE = 4
"""Template tokens around each chat message (start, role, newline; end)."""

CHAT_TOKENS_FOR_REPLY = 3
"""Template tokens that open the assistant's reply (start, role, newline)."""

VOCAB_SIZE = 32000
"""Token ids the emulator samples lie in 0..VOCAB_SIZE - 1 (a Llama-sized vocabulary)."""

EOS_TOKEN_ID = 2
"""The pseudo end-of-sequence token: sampled only as the EOS, its text is empty."""

MESSAGE_START_ID = 3
MESSAGE_END_ID = 4
NEWLINE_ID = 5
_FIRST_ORDINARY_ID = 6
"""Ids below this are special (EOS and the chat template's); text and output use the rest."""

_HASH_MODULUS = (1 << 61) - 1
_HASH_BASE = 1_000_003
_MASK64 = (1 << 64) - 1
_EOS_SALT = 0x5EED_E05
CONTEXT_HASH_START = 0
"""The rolling hash of an empty context."""

_FILLER_WORDS = (
    " the",
    " slot",
    " is",
    " a",
    " shared",
    " seat",
    " and",
    " every",
    " tenant",
    " gets",
    " its",
    " fair",
    " share",
    " of",
    " one",
    " busy",
    " GPU",
    " while",
    " tokens",
    " flow",
)


def count_text_tokens(text: str) -> int:
    """Tokens the approximation gives `text`: ceil(len / 4), at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def count_chat_tokens(message_texts: list[str]) -> int:
    """Tokens of a chat prompt: each message's text plus the template's own tokens."""
    return (
        sum(count_text_tokens(text) + CHAT_TOKENS_PER_MESSAGE for text in message_texts)
        + CHAT_TOKENS_FOR_REPLY
    )


def _ordinary_id(data: bytes) -> int:
    return _FIRST_ORDINARY_ID + zlib.crc32(data) % (VOCAB_SIZE - _FIRST_ORDINARY_ID)


def text_token_ids(text: str) -> tuple[int, ...]:
    """The ids of `text`: one per 4-character chunk (count_text_tokens of them), stable across
    runs and processes; an empty text is one token."""
    if not text:
        return (_ordinary_id(b""),)
    return tuple(
        _ordinary_id(text[start : start + CHARS_PER_TOKEN].encode("utf-8"))
        for start in range(0, len(text), CHARS_PER_TOKEN)
    )


def chat_token_ids(messages: Sequence[tuple[str, str]]) -> tuple[int, ...]:
    """The ids of a chat prompt of (role, text) messages, template included, opened for the
    assistant's reply: count_chat_tokens of the texts, as many."""
    ids: list[int] = []
    for role, text in messages:
        ids += (MESSAGE_START_ID, _ordinary_id(role.encode("utf-8")), NEWLINE_ID)
        ids += text_token_ids(text)
        ids.append(MESSAGE_END_ID)
    ids += (MESSAGE_START_ID, _ordinary_id(b"assistant"), NEWLINE_ID)
    return tuple(ids)


def synthetic_prompt_ids(key: str, length: int) -> tuple[int, ...]:
    """`length` ordinary ids drawn from a generator seeded by `key`: distinct keys give prompts
    that share no prefix (so no prefix-cache hit), the same key the same prompt."""
    rng = random.Random(key)
    return tuple(rng.randrange(_FIRST_ORDINARY_ID, VOCAB_SIZE) for _ in range(length))


def extend_hash(state: int, token_id: int) -> int:
    """The context hash after appending `token_id` to a context whose hash is `state`."""
    return (state * _HASH_BASE + token_id + 1) % _HASH_MODULUS


def context_hash(token_ids: Iterable[int], state: int = CONTEXT_HASH_START) -> int:
    """The hash of a context: `token_ids` appended, one by one, to the context of `state`."""
    for token_id in token_ids:
        state = (state * _HASH_BASE + token_id + 1) % _HASH_MODULUS
    return state


_MIX_GAMMA = 0x9E3779B97F4A7C15
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB
_ORDINARY_IDS = VOCAB_SIZE - _FIRST_ORDINARY_ID


def _mix(value: int) -> int:
    # splitmix64's finaliser: neighbouring hashes give unrelated draws.
    value = (value + _MIX_GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX_1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX_2) & _MASK64
    return value ^ (value >> 31)


def next_token_id(state: int) -> int:
    """The ordinary token sampled after a context whose hash is `state`."""
    # _mix(state), inlined: this runs for every token the emulator samples one step at a time.
    value = (state + _MIX_GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX_1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX_2) & _MASK64
    return _FIRST_ORDINARY_ID + (value ^ (value >> 31)) % _ORDINARY_IDS


def ordinary_chain(
    state: int, count: int, tokens: int, block_size: int, block_keys: list[int]
) -> int:
    """Sample `count` ordinary tokens one after another after a context of hash `state` that
    holds `tokens` tokens: returns the context's hash after them, exactly what `count` rounds
    of `state = extend_hash(state, next_token_id(state))` give, and appends to `block_keys` the
    hash after each token that fills a block (the context's length a multiple of
    `block_size`), as the prefix cache names blocks.

    The decode runs' hot loop (engine_core.EngineCore.advance_decodes): one call per run and
    sequence, with the arithmetic inlined, since a call per token costs more than the token."""
    mask, modulus, base, first, span = (
        _MASK64,
        _HASH_MODULUS,
        _HASH_BASE,
        _FIRST_ORDINARY_ID + 1,
        _ORDINARY_IDS,
    )
    gamma, mix_1, mix_2 = _MIX_GAMMA, _MIX_1, _MIX_2
    # Tokens until the context next fills a block.
    to_boundary = block_size - tokens % block_size
    for _ in range(count):
        value = (state + gamma) & mask
        value = ((value ^ (value >> 30)) * mix_1) & mask
        value = ((value ^ (value >> 27)) * mix_2) & mask
        # extend_hash(state, token_id) with token_id = _FIRST_ORDINARY_ID + draw % span.
        state = (state * base + first + (value ^ (value >> 31)) % span) % modulus
        to_boundary -= 1
        if not to_boundary:
            block_keys.append(state)
            to_boundary = block_size
    return state


BATCH_MIN = 8
"""From this many contexts on, ordinary_chains and sample_ordinary work on arrays: per token
they cost a few array operations shared by the batch, which beats a Python loop only when the
batch is not tiny."""

_U64 = np.uint64
_LOW_32 = _U64((1 << 32) - 1)
_LOW_29 = _U64((1 << 29) - 1)
_SHIFT_32, _SHIFT_29, _SHIFT_61 = _U64(32), _U64(29), _U64(61)
_SHIFT_30, _SHIFT_27, _SHIFT_31 = _U64(30), _U64(27), _U64(31)


def _next_states(states: NDArray[np.uint64]) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """For contexts of hash `states`: the ordinary token each samples, and each hash with it
    (next_token_id and extend_hash), in unsigned 64-bit arithmetic, exactly.

    The draw is splitmix64's finaliser, whose `& _MASK64` is the arrays' own wrap-around. The
    hash, (state x base + token + 1) mod (2^61 - 1), would overflow 64 bits (state < 2^61,
    base < 2^20): with state = hi x 2^32 + lo, hi x base x 2^32 = (x >> 29) x 2^61 +
    (x & (2^29 - 1)) x 2^32 for x = hi x base, and 2^61 = 1 modulo 2^61 - 1; every term fits,
    their sum is below 2^62, and one fold and one subtraction leave the residue."""
    value = states + _U64(_MIX_GAMMA)
    value ^= value >> _SHIFT_30
    value *= _U64(_MIX_1)
    value ^= value >> _SHIFT_27
    value *= _U64(_MIX_2)
    value ^= value >> _SHIFT_31
    tokens = value % _U64(_ORDINARY_IDS) + _U64(_FIRST_ORDINARY_ID)
    base = _U64(_HASH_BASE)
    x = (states >> _SHIFT_32) * base
    total = ((x & _LOW_29) << _SHIFT_32) + (x >> _SHIFT_29) + (states & _LOW_32) * base
    total += tokens + _U64(1)
    modulus = _U64(_HASH_MODULUS)
    folded = (total & modulus) + (total >> _SHIFT_61)
    folded -= modulus * (folded >= modulus)
    return tokens, folded


def sample_ordinary(states: Sequence[int]) -> tuple[list[int], list[int]]:
    """For contexts of hash `states`: the ordinary token each samples next, and each context's
    hash with it; `[next_token_id(s) for s in states]` and the matching extend_hash, on arrays
    from BATCH_MIN contexts on (one engine step's tokens)."""
    if len(states) < BATCH_MIN:
        tokens = [next_token_id(state) for state in states]
        return tokens, [extend_hash(s, t) for s, t in zip(states, tokens, strict=True)]
    tokens_array, extended = _next_states(np.array(states, dtype=np.uint64))
    return tokens_array.tolist(), extended.tolist()


def ordinary_chains(
    states: Sequence[int],
    count: int,
    tokens: Sequence[int],
    block_size: int,
    block_keys: Sequence[list[int]],
) -> list[int]:
    """ordinary_chain for each context i of hash `states[i]` holding `tokens[i]` tokens, each
    extended by the same `count` tokens, its block keys appended to `block_keys[i]`: the final
    hashes. On arrays from BATCH_MIN contexts on (a decode run's batch), token by token for all
    of them at once."""
    if len(states) < BATCH_MIN or count == 0:
        return [
            ordinary_chain(state, count, held, block_size, keys)
            for state, held, keys in zip(states, tokens, block_keys, strict=True)
        ]
    state = np.array(states, dtype=np.uint64)
    history = np.empty((count, len(states)), dtype=np.uint64)
    for step in range(count):
        _, state = _next_states(state)
        history[step] = state
    # The step after which each context first fills a block, then one every block_size steps:
    # the keys are gathered a block's worth of steps at a time, in order.
    columns = np.arange(len(states))
    first = block_size - np.array(tokens, dtype=np.int64) % block_size - 1
    for offset in range(0, count, block_size):
        rows = first + offset
        filled = rows < count
        keys = history[rows[filled], columns[filled]].tolist()
        for column, key in zip(columns[filled].tolist(), keys, strict=True):
            block_keys[column].append(key)
    result: list[int] = state.tolist()
    return result


def pseudo_eos_mean_tokens(pseudo_eos_max_tokens: int) -> float:
    """Mean output length without ignore_eos: (max + 1) / 2, as the former uniform 1..max law."""
    return (pseudo_eos_max_tokens + 1) / 2


def eos_threshold(mean_output_tokens: float) -> int:
    """The draw below which the pseudo-EOS is sampled: probability 1 / mean per token (mean >= 1;
    a mean of 1 stops every request at its first token that may be the EOS)."""
    if mean_output_tokens < 1:
        raise ValueError(f"the mean output length must be at least 1, got {mean_output_tokens}")
    return math.ceil((_MASK64 + 1) / mean_output_tokens)


def eos_sampled(state: int, threshold: int) -> bool:
    """Whether the token sampled after the context of `state` is the pseudo-EOS (when the EOS is
    allowed there: not ignore_eos, min_tokens reached)."""
    return _mix(state ^ _EOS_SALT) < threshold


def token_text(token_id: int) -> str:
    """The text of a token id: a filler word, empty for the EOS."""
    if token_id == EOS_TOKEN_ID:
        return ""
    return _FILLER_WORDS[token_id % len(_FILLER_WORDS)]


def reference_output_ids(
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    pseudo_eos_max_tokens: int = 1024,
) -> list[int]:
    """The output ids of a request as the emulator samples them (the EOS last when it stops),
    computed without an engine: what tests and clients check a stream against."""
    threshold = eos_threshold(pseudo_eos_mean_tokens(pseudo_eos_max_tokens))
    state = context_hash(prompt_token_ids)
    output: list[int] = []
    while len(output) < max_tokens:
        if not ignore_eos and len(output) >= min_tokens and eos_sampled(state, threshold):
            output.append(EOS_TOKEN_ID)
            break
        token_id = next_token_id(state)
        output.append(token_id)
        state = extend_hash(state, token_id)
    return output
