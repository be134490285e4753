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
from engine_sim.tokens import count_chat_tokens, count_text_tokens
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

    prompt_text: str
    """The prompt as text (token ids joined), seeding the output and the pseudo-EOS."""
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    """Send a final usage chunk (stream_options.include_usage)."""
    continuous_usage: bool
    """Send usage in every chunk (stream_options.continuous_usage_stats, a vLLM extension)."""


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
    prompt_text, prompt_tokens = _completion_prompt(body.get("prompt"))
    max_tokens = _optional_int(body, "max_tokens")
    return _generation_request(body, config, prompt_text, prompt_tokens, max_tokens)


def parse_chat_request(body: JsonObject, config: EngineSimConfig) -> GenerationRequest:
    """Validate a /v1/chat/completions body."""
    _check_common(body, config)
    texts = _chat_texts(body.get("messages"))
    max_completion_tokens = _optional_int(body, "max_completion_tokens")
    max_tokens = _optional_int(body, "max_tokens")
    # vLLM: max_completion_tokens (the newer name) wins over the deprecated max_tokens.
    requested = max_completion_tokens if max_completion_tokens is not None else max_tokens
    return _generation_request(body, config, "\n".join(texts), count_chat_tokens(texts), requested)


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
    prompt_text: str,
    prompt_tokens: int,
    requested_max_tokens: int | None,
) -> GenerationRequest:
    stream = _optional_bool(body, "stream") or False
    ignore_eos = _optional_bool(body, "ignore_eos") or False
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
    return GenerationRequest(
        prompt_text=prompt_text,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
    )


def _completion_prompt(prompt: object) -> tuple[str, int]:
    if isinstance(prompt, str):
        return prompt, count_text_tokens(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        # A batch of one prompt, as clients that always send lists do.
        (only,) = prompt
        if isinstance(only, str):
            return only, count_text_tokens(only)
        if _is_token_ids(only):
            return _token_ids_prompt(only)
    if _is_token_ids(prompt):
        return _token_ids_prompt(prompt)
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


def _token_ids_prompt(token_ids: list[int]) -> tuple[str, int]:
    return ",".join(str(t) for t in token_ids), len(token_ids)


def _chat_texts(messages: object) -> list[str]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            HTTPStatus.BAD_REQUEST, "messages must be a non-empty list.", param="messages"
        )
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                "each message must be an object with a string role.",
                param="messages",
            )
        texts.append(_message_text(message.get("content")))
    return texts


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


def usage(prompt_tokens: int, completion_tokens: int) -> JsonObject:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def _usage_in_chunk(prompt_tokens: int, completion_tokens: int) -> JsonObject:
    # vLLM drops None fields from usage in stream chunks.
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


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
) -> JsonObject:
    """A non-streamed response: the whole output in one choice, with usage."""
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
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
    response = identity.envelope(chunk=False)
    response.update(
        choices=[choice],
        usage=usage(prompt_tokens, completion_tokens),
        system_fingerprint=None,
        service_tier=None,
        kv_transfer_params=None,
    )
    if identity.chat:
        response["prompt_logprobs"] = None
    return response


def role_chunk(identity: ResponseIdentity, usage_so_far: tuple[int, int] | None) -> JsonObject:
    """The chunk that opens a chat stream: the assistant's role and no text yet."""
    return _chat_chunk(identity, {"role": "assistant", "content": ""}, None, usage_so_far)


def token_chunk(
    identity: ResponseIdentity,
    *,
    text: str,
    finish_reason: str | None,
    usage_so_far: tuple[int, int] | None,
) -> JsonObject:
    """The chunk carrying one output token; the last one carries the finish reason too."""
    if identity.chat:
        return _chat_chunk(identity, {"content": text}, finish_reason, usage_so_far)
    chunk = identity.envelope(chunk=True)
    chunk["choices"] = [
        {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
    ]
    # vLLM serialises completion chunks with every field, chat chunks without unset ones.
    chunk["usage"] = None if usage_so_far is None else _usage_in_chunk(*usage_so_far)
    return chunk


def _chat_chunk(
    identity: ResponseIdentity,
    delta: JsonObject,
    finish_reason: str | None,
    usage_so_far: tuple[int, int] | None,
) -> JsonObject:
    choice: JsonObject = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = None
    chunk = identity.envelope(chunk=True)
    chunk["choices"] = [choice]
    if usage_so_far is not None:
        chunk["usage"] = _usage_in_chunk(*usage_so_far)
    return chunk


def usage_chunk(
    identity: ResponseIdentity, *, prompt_tokens: int, completion_tokens: int
) -> JsonObject:
    """The last chunk stream_options.include_usage asks for: no choices, the request's usage."""
    chunk = identity.envelope(chunk=True)
    chunk["choices"] = []
    chunk["usage"] = _usage_in_chunk(prompt_tokens, completion_tokens)
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
