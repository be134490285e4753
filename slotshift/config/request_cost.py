"""Token-weighted slots: what one request costs in a pool that weighs requests by size.

In a pool with `request_cost` set, a slot is `tokens_per_slot` tokens of expected work, and a
request holds ceil((prompt tokens + max_tokens) / tokens_per_slot) slots (at least one) while it
runs, after Kubernetes APF's work estimation ("seats") and the Gateway API Inference Extension's
token concurrency. Everything that counts slots (budget_slots, floors, ceilings, grants, the
split) counts these: there is no second unit. docs/operations.md ("Token-weighted slots").
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from slotshift.config.base import ConfigModel, PositiveSeconds

PromptEstimate = Literal["length", "tokenize"]
"""How the gateway, which has no tokenizer, counts a prompt's tokens: "length" from its text's
length (`chars_per_token`); "tokenize" by asking the engine's POST /tokenize once before
admission, and from the length when that fails (counted)."""


class RequestCostConfig(ConfigModel):
    """How a pool weighs a request by its expected size, in slots."""

    tokens_per_slot: Annotated[int, Field(ge=1)]
    """Tokens of expected work (prompt plus the most it may generate) one slot stands for: a
    request costs ceil((prompt_tokens + max_tokens) / tokens_per_slot) slots, at least 1. The
    pool's budget_slots, the tenants' floor_slots and ceiling_slots count these slots."""

    max_model_len_tokens: Annotated[int, Field(ge=1)]
    """The engine's context length (vLLM's --max-model-len): a request that sets neither
    max_tokens nor max_completion_tokens is charged what the engine would let it generate,
    this less its prompt's estimate (at least 1 token)."""

    prompt_estimate: PromptEstimate = "length"
    """"length": estimate the prompt's tokens from its text's length by `chars_per_token`;
    "tokenize": ask the engine's POST /tokenize (one call per request, before admission) and
    fall back to the length estimate when the engine cannot answer. A prompt already given as
    token ids is counted exactly either way."""

    chars_per_token: Annotated[float, Field(gt=0)] = 4.0
    """Characters per token for the "length" estimate (and the fallback of "tokenize"). About 4
    for English text with common BPE tokenizers; code, numbers and most other languages take
    fewer characters per token (the estimate is then low), very repetitive text more (it is
    then high). A wrong value misweighs requests, it never lets the budget be exceeded."""

    tokenize_timeout_s: PositiveSeconds = 2.0
    """With "tokenize": the longest the gateway waits for the engine's /tokenize answer before it
    takes the length estimate; the request waits this long at most before it queues."""

    @model_validator(mode="after")
    def _slot_within_context(self) -> RequestCostConfig:
        if self.tokens_per_slot > self.max_model_len_tokens:
            raise ValueError(
                f"tokens_per_slot ({self.tokens_per_slot}) is above max_model_len_tokens "
                f"({self.max_model_len_tokens}): no request could cost more than one slot"
            )
        return self
