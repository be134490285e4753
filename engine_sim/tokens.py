"""Tokens without a tokenizer: deterministic counts, filler text and a pseudo end-of-sequence.

The emulator must answer the same request the same way every time, and count tokens roughly as a
real BPE tokenizer would, without loading one:
- a text counts ceil(characters / 4) tokens, at least 1 (English averages about 4 characters per
  token under the common BPE vocabularies);
- a chat conversation counts its messages' text plus a fixed template overhead per message and
  for the assistant turn that the template opens (as ChatML-style templates add);
- generated text is a fixed cycle of short words, each one token, offset by the request's seed;
- without ignore_eos a request ends at a pseudo-EOS: 1 + (seed mod pseudo_eos_max_tokens) output
  tokens, where the seed is the CRC-32 of the prompt (so the same prompt always stops at the same
  place, and different prompts spread uniformly).
"""

from __future__ import annotations

import math
import zlib

CHARS_PER_TOKEN = 4
"""Characters one token stands for in the approximation."""

CHAT_TOKENS_PER_MESSAGE = 4
"""Template tokens around each chat message (role header, separators)."""

CHAT_TOKENS_FOR_REPLY = 3
"""Template tokens that open the assistant's reply."""

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


def seed_of(prompt: str) -> int:
    """The request's seed: CRC-32 of its prompt text (stable across runs and processes)."""
    return zlib.crc32(prompt.encode("utf-8"))


def filler_token(seed: int, index: int) -> str:
    """The text of output token `index` (0-based) of the request with `seed`."""
    return _FILLER_WORDS[(seed + index) % len(_FILLER_WORDS)]


def pseudo_eos_position(seed: int, pseudo_eos_max_tokens: int) -> int:
    """Output tokens after which the request with `seed` stops by itself (1..max inclusive)."""
    return 1 + seed % pseudo_eos_max_tokens
