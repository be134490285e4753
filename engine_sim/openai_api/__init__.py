"""vLLM's OpenAI-compatible protocol, as far as the emulator speaks it: parsing and shaping.

Pure functions over JSON-like values, one module per concept (the routes that use them are
engine_sim/server.py's):
- protocol: the JSON object type, the vLLM release emulated, ApiError (vLLM's error body);
- parsing: requests validated into GenerationRequest (or an ApiError with vLLM's status, type
  and message), and the /tokenize request;
- responses: responses, stream chunks, usage, the model list and server-sent events, built as
  the dictionaries vLLM's pydantic models serialise to.
Everything public is imported from here (`from engine_sim.openai_api import ApiError`).
"""

from engine_sim.openai_api.parsing import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    GenerationRequest,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
    tokenize_response,
)
from engine_sim.openai_api.protocol import EMULATED_VLLM_VERSION, ApiError, JsonObject
from engine_sim.openai_api.responses import (
    PromptTokensDetails,
    ResponseIdentity,
    full_response,
    models_response,
    role_chunk,
    sse_event,
    token_chunk,
    usage,
    usage_chunk,
)

__all__ = [
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "EMULATED_VLLM_VERSION",
    "ApiError",
    "GenerationRequest",
    "JsonObject",
    "PromptTokensDetails",
    "ResponseIdentity",
    "full_response",
    "models_response",
    "parse_chat_request",
    "parse_completion_request",
    "parse_json_body",
    "role_chunk",
    "sse_event",
    "token_chunk",
    "tokenize_response",
    "usage",
    "usage_chunk",
]
