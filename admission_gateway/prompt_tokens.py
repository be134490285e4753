"""The engine's count of a prompt's tokens, for pools that weigh requests with "tokenize".

One POST /tokenize per request, before admission (vLLM's TokenizeCompletionRequest for a text
prompt, TokenizeChatRequest for messages; both answer `count`). Any failure (unreachable, a
status other than 200, a body without a count, slower than tokenize_timeout_s) gives None: the
caller then takes the length estimate (admission_gateway/request_cost.py) and counts it
(GatewayState.prompt_estimate_fallbacks_total), so that a pool whose engine never tokenizes
shows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from admission_gateway.upstream import EngineClient, EngineError

logger = logging.getLogger(__name__)


class PromptCounter:
    """Asks one pool's engine how many tokens a prompt has."""

    def __init__(self, *, engine: EngineClient, engine_url: str, timeout_s: float) -> None:
        self._engine = engine
        self._url = engine_url.rstrip("/") + "/tokenize"
        self._timeout_s = timeout_s

    async def count(
        self, tokenizable: Mapping[str, Any], model: Any, headers: Mapping[str, str]
    ) -> int | None:
        """The engine's token count of `tokenizable` (request_cost.PromptSize.tokenizable) for
        `model` (left out when not a string), or None when it gave none. `headers`: the trace
        headers to send along."""
        query = dict(tokenizable)
        if isinstance(model, str):
            query["model"] = model
        try:
            answer = await self._engine.ask_json(
                self._url, query, headers=headers, timeout_s=self._timeout_s
            )
            count = answer["count"]
        except (EngineError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            logger.debug("the engine at %s did not count a prompt: %s", self._url, exc)
            return None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            logger.debug("the engine at %s counted a prompt as %r", self._url, count)
            return None
        return count
