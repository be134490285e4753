"""Requests, as vLLM validates them: a completion's or a chat's body into a GenerationRequest,
or an ApiError with vLLM's status, type and message; and the /tokenize request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import TypeGuard

from engine_sim.openai_api.protocol import ApiError, JsonObject
from engine_sim.profiles import effective_profile
from engine_sim.tokens import chat_token_ids, text_token_ids
from slotshift.config import EngineSimConfig


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
    """vLLM's POST /tokenize: for a completion prompt (TokenizeCompletionRequest) the prompt's
    token ids as a completion of it would see them; for chat `messages` (TokenizeChatRequest,
    the generation prompt added, as vLLM's default) the ids a chat completion of them sees."""
    model = body.get("model")
    if model is not None and model != effective_profile(config).model_name:
        raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", param="model")
    if "messages" in body:
        tokens = list(chat_token_ids(_chat_messages(body.get("messages"))))
    else:
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
