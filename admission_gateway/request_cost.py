"""What one request costs in slots in a pool that weighs requests (pools[].request_cost).

A request costs ceil(expected tokens / tokens_per_slot) slots, at least 1, where its expected
tokens are its prompt's tokens plus the most it may generate, for each sequence it asks for,
capped at the engine's context length. The gateway has no tokenizer, so the prompt's tokens are:

- counted exactly where the prompt is token ids (a completion's `prompt` as ids);
- the engine's count from its POST /tokenize, where the pool says "tokenize" and the proxy got
  one (admission_gateway/prompt_tokens.py asks; this module only takes the answer);
- otherwise estimated from the text's length: ceil(characters / chars_per_token). Chat
  messages count their text content only (string content and "text" parts); the chat
  template's own tokens are not counted, so a chat estimate is low by a few tokens a message.

The most a request may generate: `max_completion_tokens` (chat; it wins over `max_tokens`, as in
vLLM), else `max_tokens`; where neither is set, what the engine would allow: vLLM's completions
default (16 tokens) for a completion that leaves `max_tokens` out, and the rest of the context
(max_model_len_tokens less the prompt) for a chat request or an explicit null. A value the engine
would refuse (not a positive integer) is charged as the rest of the context; the engine answers
the request with a 400 anyway.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from slotshift.config import RequestCostConfig

EstimatedBy = Literal["token_ids", "tokenize", "length", "length_fallback"]
"""How a request's prompt tokens were found: "token_ids" counted from a prompt of ids (exact);
"tokenize" the engine's /tokenize count; "length" from the text's length; "length_fallback"
from the length because the pool says "tokenize" and the engine gave no count."""

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""vLLM's CompletionRequest.max_tokens when a request leaves it out."""


@dataclass(frozen=True, slots=True)
class PromptSize:
    """A request's prompt as the gateway can measure it without a tokenizer."""

    text_chars: int
    """Characters of prompt text (every text prompt of a batch, every message's text)."""
    token_ids: int
    """Tokens of prompts given as token ids (counted exactly)."""
    sequences: int
    """Prompts in the request (a completion may batch several); each is generated for."""
    tokenizable: Mapping[str, Any] | None
    """The body for the engine's POST /tokenize that counts the whole text prompt in one call
    (without `model`), or None where no one call can: no text, or several text prompts."""


@dataclass(frozen=True, slots=True)
class RequestCost:
    """A request's cost and what it rests on."""

    slots: int
    """Slots the request holds while it runs (at least 1)."""
    prompt_tokens: int
    """The prompt's tokens, as found by `estimated_by`."""
    max_tokens: int
    """The most tokens it was charged for generating, per sequence."""
    estimated_by: EstimatedBy


def prompt_size(document: Mapping[str, Any]) -> PromptSize:
    """Measure the prompt of a /v1/completions (`prompt`) or /v1/chat/completions (`messages`)
    body. Shapes the engine would refuse measure as what they hold of text and ids."""
    if "messages" in document:
        chars = sum(_message_chars(m) for m in _items(document.get("messages")))
        messages = document.get("messages")
        tokenizable: Mapping[str, Any] | None = (
            {"messages": messages} if chars > 0 and isinstance(messages, list) else None
        )
        return PromptSize(text_chars=chars, token_ids=0, sequences=1, tokenizable=tokenizable)
    prompt = document.get("prompt")
    if isinstance(prompt, str):
        return PromptSize(len(prompt), 0, 1, {"prompt": prompt} if prompt else None)
    if not isinstance(prompt, list) or not prompt:
        return PromptSize(0, 0, 1, None)
    if all(isinstance(token, int) for token in prompt):
        return PromptSize(0, len(prompt), 1, None)
    chars = ids = 0
    texts: list[str] = []
    for one in prompt:
        if isinstance(one, str):
            chars += len(one)
            texts.append(one)
        elif isinstance(one, list):
            ids += sum(1 for token in one if isinstance(token, int))
    single = texts[0] if len(prompt) == 1 and len(texts) == 1 and texts[0] else None
    return PromptSize(chars, ids, len(prompt), {"prompt": single} if single else None)


def requested_max_tokens(document: Mapping[str, Any]) -> int | None:
    """The most tokens a request may generate per sequence, as the engine reads it; None: up to
    the end of the context."""
    chat = "messages" in document
    for field in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        if field in document and document[field] is not None:
            value = document[field]
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
            return None
    if not chat and "max_tokens" not in document:
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    return None


def request_cost(
    document: Mapping[str, Any],
    config: RequestCostConfig,
    *,
    counted_prompt_tokens: int | None = None,
    tokenize_failed: bool = False,
) -> RequestCost:
    """The cost of the request `document` in a pool weighing requests by `config`.

    `counted_prompt_tokens` is the engine's /tokenize count of the prompt's text, where the
    proxy got one (it replaces the length estimate of the text; ids are counted as ever);
    `tokenize_failed` says the pool asked for one and got none (the estimate is then labelled
    "length_fallback").
    """
    size = prompt_size(document)
    if counted_prompt_tokens is not None and size.text_chars > 0:
        prompt_tokens = max(0, counted_prompt_tokens) + size.token_ids
        estimated_by: EstimatedBy = "tokenize"
    elif size.text_chars > 0:
        prompt_tokens = math.ceil(size.text_chars / config.chars_per_token) + size.token_ids
        estimated_by = "length_fallback" if tokenize_failed else "length"
    else:
        prompt_tokens = size.token_ids
        estimated_by = "token_ids"
    context = config.max_model_len_tokens
    room = max(1, context - prompt_tokens)
    asked = requested_max_tokens(document)
    max_tokens = room if asked is None else min(asked, room)
    sequences = size.sequences * _n(document)
    tokens = min(prompt_tokens + sequences * max_tokens, sequences * context)
    slots = max(1, math.ceil(tokens / config.tokens_per_slot))
    return RequestCost(
        slots=slots, prompt_tokens=prompt_tokens, max_tokens=max_tokens, estimated_by=estimated_by
    )


def _n(document: Mapping[str, Any]) -> int:
    """Sequences generated per prompt (`n`); what the engine would refuse counts as 1."""
    n = document.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


def _items(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else ()


def _message_chars(message: Any) -> int:
    if not isinstance(message, dict):
        return 0
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    chars = 0
    for part in _items(content):
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            chars += len(part["text"])
        elif isinstance(part, str):
            chars += len(part)
    return chars
