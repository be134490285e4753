"""Transparent resume of a paused request: the pure core (no I/O, no event loop).

A preemptible tenant's request may be paused: the gateway closes its upstream connection, waits
for a slot, and sends a *continuation* to `POST /v1/completions` whose prompt is the original
prompt's token ids plus the tokens generated so far, with `max_tokens` and `min_tokens` reduced by
what was generated. vLLM's prefix cache makes the re-prefill cheap. The client sees one answer, as
if the request had never been paused. This module is the only place that knows the OpenAI/vLLM
0.32 JSON shapes this takes (vllm/entrypoints/openai/{completion,chat_completion}/serving.py):

- a completions stream chunk carries `choices[0].text`, `choices[0].token_ids` (with
  `return_token_ids`) and, on the first chunk with output, `choices[0].prompt_token_ids`;
- a chat stream opens with a role chunk (`delta: {role, content: ""}`) that carries the rendered
  prompt's ids as top-level `prompt_token_ids`; deltas carry `delta.content` and
  `choices[0].token_ids`; the finishing chunk adds `finish_reason` and `stop_reason`;
- with `stream_options.include_usage` the stream ends with a chunk whose `choices` is `[]` and
  whose `usage` has `prompt_tokens_details.cached_tokens` when the server runs with
  `--enable-prompt-tokens-details`; then `data: [DONE]`;
- a failure mid-stream is one `data: {"error": {...}}` event, then `[DONE]`.

Roles: `not_resumable` says whether a request's shape may be paused and resumed exactly;
`SseDecoder` cuts an upstream byte stream into event payloads; `Resumption` (one per request,
across all its attempts) builds each attempt's upstream request, turns upstream events into the
client's events, and assembles the final usage or the non-streamed response.

Only token-exact shapes resume (see `not_resumable`): a continuation is the same computation as
the uninterrupted request only when sampling depends on nothing but the context, which a seed,
stop strings, output-only penalties, logprobs, n > 1, beam search, structured output, tools or
reasoning parsers all break.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

COMPLETIONS_PATH: Final = "/v1/completions"
CHAT_PATH: Final = "/v1/chat/completions"

DONE: Final = b"[DONE]"
"""The payload of the event that ends an OpenAI-style stream."""

SSE_KEEPALIVE: Final = b": slotshift paused\n\n"
"""An SSE comment for a paused stream: clients ignore it, idle proxies see traffic."""

COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16
"""vLLM's `CompletionRequest.max_tokens` default when the key is absent (an explicit null means
up to the context limit, which the gateway does not know)."""

DONE_EVENT: Final = b"data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""

ASSEMBLED_STREAM_INTERVAL: Final = 16
"""Tokens per upstream chunk when the gateway assembles the answer itself (a client that did
not ask for a stream): vLLM's per-request `stream_interval`. The client sees one response
either way, and one chunk a token would cost the engine's API server and the gateway a JSON
event each; a pause then discards at most this many tokens less one."""


class ResumeError(Exception):
    """Base of this module's errors."""


class UpstreamProtocolError(ResumeError):
    """The engine sent an event this module cannot interpret (not the JSON vLLM sends)."""


class CannotResume(ResumeError):
    """The next attempt cannot continue the answer exactly, and restarting would show the
    client a second, different beginning."""


class SseTooLong(ResumeError):
    """An upstream SSE event grew past the decoder's limit without ending."""


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One SSE `data:` event for a JSON object, serialized as vLLM does (compact, UTF-8)."""
    return b"data: " + _dumps(payload) + b"\n\n"


def is_done(payload: bytes) -> bool:
    """Whether an event payload (from `SseDecoder.feed`) is the stream's `[DONE]`."""
    return payload.strip() == DONE


class SseDecoder:
    """Cuts a server-sent-event byte stream, split anywhere, into the events' `data` payloads.

    Lines end in `\\n` or `\\r\\n`; an empty line ends an event. Comment lines (`:` first) and
    fields other than `data` (`event`, `id`, `retry`) are ignored, so an event with no `data`
    line yields nothing. Several `data` lines of one event are joined with `\\n`, as the SSE
    specification says. A lone `\\r` as line end is not supported (vLLM and aiohttp never send it).
    """

    def __init__(self, max_event_bytes: int = 1 << 22) -> None:
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._event_bytes = 0
        self._max_event_bytes = max_event_bytes
        # Attributes, not properties, where the relay reads them once an event: a property's
        # getter is a call from C, a fresh interpreter frame each time.
        self.pending = False
        """Whether bytes of an unfinished event are held (at the end of a stream: it was cut)."""

    def feed(self, chunk: bytes) -> list[bytes]:
        """Consume the next bytes; return the payloads of the events they complete, in order.

        Raises SseTooLong when one event exceeds max_event_bytes (an engine that never ends its
        event would otherwise grow the buffer without bound).
        """
        if chunk.endswith(b"\n\n") and not self._buffer and not self._data:
            # Nearly every read of a vLLM stream is whole events of one line each, most often
            # one: cut them in C. (`\r` is never raw in JSON; an event of several lines, where
            # there are more line ends than two an event, takes the general path.)
            if (
                chunk.find(b"\n") == len(chunk) - 2
                and chunk.startswith(b"data:")
                and chunk[-3:-2] != b"\r"
            ):
                return [chunk[6:-2] if chunk[5:6] == b" " else chunk[5:-2]]
            events = chunk.split(b"\n\n")
            if (
                not events[-1]
                and chunk.count(b"\n") == 2 * len(events) - 2
                and chunk.find(b"\r") < 0
            ):
                del events[-1]
                return [
                    event[6:] if event[5:6] == b" " else event[5:]
                    for event in events
                    if event.startswith(b"data:")
                ]
        self._buffer += chunk
        payloads: list[bytes] = []
        start = 0
        while (end := self._buffer.find(b"\n", start)) >= 0:
            line = bytes(self._buffer[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    payloads.append(b"\n".join(self._data))
                self._data = []
                self._event_bytes = 0
                continue
            self._event_bytes += len(line)
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        del self._buffer[:start]
        self.pending = bool(self._buffer) or bool(self._data)
        if self._event_bytes + len(self._buffer) > self._max_event_bytes:
            raise SseTooLong(f"an SSE event exceeds {self._max_event_bytes} bytes")
        return payloads


# --- Which shapes resume exactly -------------------------------------------------------------

_Rule = Callable[[Any], str | None]


def _any(_: Any) -> str | None:
    return None


def _is_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be a boolean"


def _is_number(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return None if ok else "must be a number"


def _is_count(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "must be a non-negative integer"


def _is_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return None if ok else "must be an integer"


def _is_str(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def _is_int_list(value: Any) -> str | None:
    return None if _int_list(value) else "must be a list of integers"


def _is_dict(value: Any) -> str | None:
    return None if isinstance(value, dict) else "must be an object"


def _only(*allowed: Any, why: str) -> _Rule:
    def rule(value: Any) -> str | None:
        # `is` for booleans: 0 == False would let logprobs=0 through as "false".
        for candidate in allowed:
            if type(value) is type(candidate) and value == candidate:
                return None
        return why

    return rule


def _zero_penalty(value: Any) -> str | None:
    if _is_number(value) is None and value == 0:
        return None
    return "counts only output tokens, so a continuation would penalize differently"


def _stream_options(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "must be an object"
    for key, item in value.items():
        if key not in ("include_usage", "continuous_usage_stats"):
            return f"has {key!r}, which is not on the resumable list"
        if item is not None and not isinstance(item, bool):
            return f"{key} must be a boolean"
    return None


def _response_format(value: Any) -> str | None:
    if isinstance(value, dict) and value.get("type") == "text" and set(value) <= {"type"}:
        return None
    return "structured output constrains tokens by a grammar state a continuation does not carry"


def _chat_template_kwargs(value: Any) -> str | None:
    # Rendering happens once (the continuation reuses the rendered ids); only a template that
    # enables thinking matters, because its output is then split by a reasoning parser.
    if not isinstance(value, dict):
        return "must be an object"
    for key, item in value.items():
        if key not in ("enable_thinking", "thinking") or item is not False:
            return f"{key!r} may enable hidden reasoning"
    return None


_STOP_WHY = "stop strings match text across the cut, which a continuation cannot see"
_LOGPROBS_WHY = "logprobs are not assembled across attempts"

# Keys both endpoints accept with the same meaning, and what each value must be to resume.
_COMMON_RULES: Final[Mapping[str, _Rule]] = {
    "model": _is_str,
    "stream": _is_bool,
    "stream_options": _stream_options,
    "user": _is_str,
    "temperature": _is_number,
    "top_p": _is_number,
    "top_k": _is_number,
    "min_p": _is_number,
    # vLLM's repetition penalty counts prompt and output tokens alike, and a continuation's prompt
    # is exactly the original prompt plus the output so far: same set, same penalty.
    "repetition_penalty": _is_number,
    "presence_penalty": _zero_penalty,
    "frequency_penalty": _zero_penalty,
    "logit_bias": _is_dict,
    "ignore_eos": _is_bool,
    "min_tokens": _is_count,
    "max_tokens": _is_count,
    "stop_token_ids": _is_int_list,
    "include_stop_str_in_output": _is_bool,
    "allowed_token_ids": _is_int_list,
    "skip_special_tokens": _is_bool,
    "spaces_between_special_tokens": _is_bool,
    "add_special_tokens": _is_bool,
    "return_token_ids": _is_bool,
    "priority": _is_int,
    "cache_salt": _is_str,
    "request_id": _is_str,
    "stream_interval": _is_count,
    "n": _only(1, why="n > 1 is several answers; only one resumes"),
    "best_of": _only(1, why="best_of > 1 is several answers; only one resumes"),
    "use_beam_search": _only(False, why="beam search keeps beams a continuation does not carry"),
    "stop": _only([], why=_STOP_WHY),
    "echo": _only(False, why="echo would repeat the prompt on the continuation"),
    "response_format": _response_format,
}

_COMPLETIONS_RULES: Final[Mapping[str, _Rule]] = {
    **_COMMON_RULES,
    "prompt": _any,  # checked by _prompt_reason
}

_CHAT_RULES: Final[Mapping[str, _Rule]] = {
    **_COMMON_RULES,
    "messages": _any,  # checked by _messages_reason
    "max_completion_tokens": _is_count,
    "logprobs": _only(False, why=_LOGPROBS_WHY),
    "top_logprobs": _only(0, why=_LOGPROBS_WHY),
    "tool_choice": _only("none", why="tool calls are parsed from the output"),
    "parallel_tool_calls": _is_bool,
    "reasoning_effort": _only("none", why="reasoning is parsed out of the output"),
    "include_reasoning": _only(True, why="hidden reasoning is parsed out of the output"),
    "chat_template_kwargs": _chat_template_kwargs,
    "chat_template": _is_str,
    "add_generation_prompt": _is_bool,
    "continue_final_message": _is_bool,
}

# Why a known key outside the lists does not resume (anything else: "not on the list").
_EXCLUDED: Final[Mapping[str, str]] = {
    "seed": "a seed makes sampling depend on the step count, which restarts at a continuation",
    "logprobs": _LOGPROBS_WHY,
    "top_logprobs": _LOGPROBS_WHY,
    "prompt_logprobs": _LOGPROBS_WHY,
    "logprob_token_ids": _LOGPROBS_WHY,
    "suffix": "a suffix is rendered around the prompt, which the continuation replaces",
    "tools": "tool calls are parsed from the output",
    "functions": "tool calls are parsed from the output",
    "structured_outputs": "structured output constrains tokens by a grammar state",
    "guided_json": "structured output constrains tokens by a grammar state",
    "guided_regex": "structured output constrains tokens by a grammar state",
    "guided_choice": "structured output constrains tokens by a grammar state",
    "guided_grammar": "structured output constrains tokens by a grammar state",
    "reasoning": "reasoning is parsed out of the output",
    "thinking_token_budget": "reasoning is parsed out of the output",
    "truncate_prompt_tokens": "truncation would cut the continuation's longer prompt differently",
    "bad_words": "bad words match output tokens only, across the cut",
    "repetition_detection": "repetition detection looks at output tokens only, across the cut",
    "prompt_embeds": "embeddings have no token ids to continue from",
}


def not_resumable(path: str, body: Mapping[str, Any]) -> str | None:
    """None when a request may be paused and resumed exactly, else why not (for logs/metrics).

    Resumable: `/v1/completions` with one prompt (a string, a list of token ids, or a list of one
    of either) and `/v1/chat/completions` whose messages are text only and whose output is bounded
    explicitly (`max_completion_tokens`, or `max_tokens`); completions are bounded by vLLM's
    default of 16 when `max_tokens` is absent. Every body key must be on an allowlist, with a
    value that keeps the continuation token-exact: no seed, stop strings, echo, suffix, logprobs,
    non-zero presence or frequency penalty, n or best_of above 1, beam search, structured output
    (a `response_format` other than text), tools, or reasoning (`reasoning_effort` other than
    "none", `include_reasoning: false`, `chat_template_kwargs` other than thinking disabled).
    A key whose value is JSON null counts as absent (vLLM reads null as the default), but for
    a completion's `max_tokens`, where null means the context limit.
    `stream_options` without `stream` is refused too: vLLM rejects it, and the gateway streams
    every preemptible request upstream, which would accept it.
    """
    if path == COMPLETIONS_PATH:
        rules = _COMPLETIONS_RULES
    elif path == CHAT_PATH:
        rules = _CHAT_RULES
    else:
        return f"{path} is not a generation route that resumes"
    for key, value in body.items():
        if value is None:
            continue
        rule = rules.get(key)
        if rule is None:
            why = _EXCLUDED.get(key, "it is not on the resumable list")
            return f"{key!r}: {why}"
        if (why_not := rule(value)) is not None:
            return f"{key!r}: {why_not}"
    if body.get("stream_options") is not None and not body.get("stream"):
        return "'stream_options' without 'stream': vLLM rejects it"
    if path == COMPLETIONS_PATH:
        if "max_tokens" in body and body["max_tokens"] is None:
            return "'max_tokens': null bounds the output by the context length, unknown here"
        return _prompt_reason(body.get("prompt"))
    if body.get("max_completion_tokens") is None and body.get("max_tokens") is None:
        return "the output is not bounded (max_completion_tokens or max_tokens)"
    return _messages_reason(body.get("messages"))


def _prompt_reason(prompt: Any) -> str | None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return None
    if prompt and _int_list(prompt):
        return None
    return "'prompt': only one prompt (a string or one list of token ids) resumes"


_TEXT_ROLES: Final = frozenset({"system", "developer", "user", "assistant"})


def _messages_reason(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for message in messages:
        if not isinstance(message, dict) or not set(message) <= {"role", "content", "name"}:
            return "'messages': only role, content and name resume (no tool calls or reasoning)"
        if message.get("role") not in _TEXT_ROLES:
            return f"'messages': role {message.get('role')!r} does not resume"
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(
            isinstance(part, dict) and part.get("type") == "text" for part in content
        ):
            # Media becomes placeholder ids; a continuation on token ids would lose the media.
            return "'messages': only text content resumes"
    return None


# --- One request across its attempts ---------------------------------------------------------

# Keys copied from the original body into a continuation on /v1/completions: those that mean
# the same on both routes and act per step (so they act the same on a continuation).
_CONTINUATION_KEYS: Final = (
    "model",
    "user",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "ignore_eos",
    "stop_token_ids",
    "include_stop_str_in_output",
    "allowed_token_ids",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "priority",
    "cache_salt",  # the continuation must hash its blocks as the original did to hit the cache
    "stream_interval",
)


@dataclass
class _Attempt:
    continuation: bool
    upstream_chat: bool
    """Whether this attempt's events are chat chunks (the original request on the chat route)."""
    prompt_tokens: int | None
    """The attempt's prompt length, when known before it starts."""
    recomputes: bool
    """Whether the engine had computed this request's prompt before this attempt started."""
    waste_counted: bool = False
    token_prefix: bytes | None = None
    """How this attempt's completions token chunks begin, up to the text (`_TOKEN_CHUNK`),
    once its first chunk has told its id; None until then, and for chat chunks."""
    token_line: bytes | None = None
    """`data: ` and `token_prefix`: how a read of one whole token chunk begins."""
    decoder: SseDecoder = field(default_factory=SseDecoder)
    """This attempt's events (a cut leaves half an event behind: each attempt decodes afresh)."""


class Resumption:
    """One resumable request, across all its upstream attempts.

    Use: `upstream_request()` gives the next attempt's path and body; feed that attempt's event
    payloads to `feed()` and write what it returns to the client; when the attempt is cut, call
    `pause()` (a deliberate pause, allowed when `pausable()`) or `attempt_ended()` (anything
    else); then `upstream_request()` again, until `finished`. Then a streaming client gets
    `final_events()`, a non-streaming one `response()`. An upstream error event ends the answer
    (`error` is set): a streaming client has already been sent it, a non-streaming one should get
    it as the response body.

    Not thread-safe, no I/O: the gateway owns connections, slots and timing.
    """

    def __init__(self, path: str, body: Mapping[str, Any]) -> None:
        """Raises ValueError when `not_resumable(path, body)` gives a reason."""
        reason = not_resumable(path, body)
        if reason is not None:
            raise ValueError(f"request does not resume: {reason}")
        self._path = path
        self._body = dict(body)
        self._chat = path == CHAT_PATH
        self.client_streams: Final = bool(body.get("stream"))
        """Whether the client asked for a stream (else the gateway assembles `response()`)."""
        options = body.get("stream_options") or {}
        self._client_usage = self.client_streams and bool(options.get("include_usage"))
        self._continuous_usage = self._client_usage and bool(options.get("continuous_usage_stats"))
        self._client_token_ids = bool(body.get("return_token_ids"))
        self.in_flight = False
        """Whether an attempt was started and has not ended (an attribute: the relay reads it
        once an event, and a property's getter is a call from C)."""
        self._max_output = _output_bound(path, body)
        self._min_tokens = int(body.get("min_tokens") or 0)

        self._prompt_ids: list[int] | None = _prompt_ids_of(path, body)
        self._prompt_ids_tokenized = False
        """Whether `_prompt_ids` are /tokenize's (`take_prompt_ids`), which the engine's own
        (a stream's `prompt_token_ids`) replace."""
        self._generated: list[int] = []
        self._text: list[str] = []
        self._output_seen = False
        self._ids_complete = True
        self._parsed_output: str | None = None

        self._identity: dict[str, Any] | None = None
        self._client_identity: dict[str, Any] | None = None
        """`_identity_fields()` once the identity is known (it never changes after)."""
        self._client_token_prefix: bytes | None = None
        """`_token_prefix` of the client's identity, once a token chunk was spliced."""
        self._role: str | None = None
        self._role_sent = False
        self._prompt_ids_shown = False
        self._client_saw_output = False
        self._synthetic_finish = False
        self._system_fingerprint: Any = None

        self._attempt: _Attempt | None = None
        self._prefill_done = False
        self._original_usage: dict[str, Any] | None = None
        self._last_usage: dict[str, Any] | None = None
        self._last_usage_continuation = False

        self.finished = False
        """Whether the answer is complete (a finish_reason arrived) or ended by an error."""
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.error: dict[str, Any] | None = None
        """The upstream error event that ended the answer (vLLM's `{"error": {...}}`), if any."""
        self.attempts = 0
        """Upstream attempts started so far."""
        self.pauses = 0
        """How many times `pause()` was called."""
        self.recomputed_prompt_tokens = 0
        """Prompt tokens the engine computed again because an earlier attempt had computed them:
        per later attempt, its prompt tokens minus the `prompt_tokens_details.cached_tokens` its
        usage reports. When its usage names no cached tokens (the server runs without
        `--enable-prompt-tokens-details`), all its prompt tokens count: an upper bound. An
        attempt cut before its usage chunk counts nothing: how much of its prompt the cache
        held is unknown, and counting all of it (hundreds of tokens where a block's worth was
        recomputed) would close the pool's waste cap on a guess and leave lenders waiting. The
        engine's own counters are the truth (the bench reads them)."""
        self.discarded_output_tokens = 0
        """Output tokens thrown away because an attempt had to restart from scratch (the
        continuation was impossible: the engine returned no token ids)."""

    # -- what the gateway asks --

    @property
    def generated_tokens(self) -> int:
        """Output tokens delivered so far in the answer (all attempts, restarts excluded)."""
        if not self._ids_complete and self._last_usage is not None:
            return int(self._last_usage.get("completion_tokens") or 0)
        return len(self._generated)

    @property
    def prompt_tokens(self) -> int | None:
        """The original prompt's length in tokens, once known (from ids or upstream usage)."""
        if self._prompt_ids is not None:
            return len(self._prompt_ids)
        if self._original_usage is not None:
            return int(self._original_usage.get("prompt_tokens") or 0)
        return None

    def pausable(self) -> bool:
        """Whether pausing the attempt in flight now loses nothing: it has produced no output
        yet, or the output so far can be continued exactly (the prompt's ids and every output
        token's id are known, and no parser rewrote the output). False when nothing is in flight
        or the answer is finished."""
        if self._attempt is None or self.finished:
            return False
        return not self._output_seen or self._continuable()

    def can_go_on(self) -> bool:
        """Whether, between attempts, a next attempt can carry the answer on as one answer: it
        is not finished, and either what it has can be continued exactly, or the client has seen
        none of it (a restart). False while an attempt is in flight. What decides whether a
        request whose engine was lost may move to another replica (upstream_request would raise
        CannotResume where this is False)."""
        if self._attempt is not None or self.finished:
            return False
        if not self._output_seen or self._continuable():
            return True
        return not (self.client_streams and self._client_saw_output)

    def upstream_request(self) -> tuple[str, bytes]:
        """The path and JSON body of the next upstream attempt, which the caller then starts.

        The first attempt is the original request, streamed, with `stream_options.include_usage`
        and `return_token_ids` on (the client's `continuous_usage_stats` is kept). After a cut
        with output, a continuation on /v1/completions: prompt = the original prompt's ids + the
        ids generated so far, `max_tokens` = what remains, `min_tokens` = max(0, min - generated),
        the sampling keys that mean the same there copied (`request_id` is not: the engine may
        still hold the cut attempt under it). After a cut with nothing generated, the original
        again. After a cut whose output cannot be continued (no token ids), the original again,
        its output discarded, unless a streaming client has already seen output: CannotResume.
        Raises RuntimeError when an attempt is in flight or the answer is finished.
        """
        if self._attempt is not None:
            raise RuntimeError("an upstream attempt is still in flight")
        if self.finished:
            raise RuntimeError("the answer is finished")
        if self._output_seen and self._continuable():
            path, body = COMPLETIONS_PATH, self._continuation_body()
            prompt_tokens: int | None = len(body["prompt"])
            upstream_chat, continuation = False, True
        else:
            if self._output_seen:
                self._restart()
            path, body = self._path, self._original_body()
            prompt_tokens = self.prompt_tokens
            upstream_chat, continuation = self._chat, False
        self.in_flight = True
        self._attempt = _Attempt(
            continuation=continuation,
            upstream_chat=upstream_chat,
            prompt_tokens=prompt_tokens,
            recomputes=self._prefill_done,
        )
        self.attempts += 1
        return path, _dumps(body)

    def relay(self, chunk: bytes) -> bytes:
        """Take one read of the attempt in flight's upstream bytes (split anywhere): the bytes
        `feed` gives for the events it completes, joined (b"" for none); what follows the event
        that ends the attempt is dropped. Raises what `feed` and `SseDecoder.feed` raise.

        The read vLLM sends most, one whole token chunk of the attempt's own prefix, goes to the
        byte-level rewrite at once, without the decoder or a list."""
        attempt = self._attempt
        if attempt is None:
            raise RuntimeError("no upstream attempt is in flight")
        line = attempt.token_line
        if (
            line is not None
            and chunk.startswith(line)
            and not self.finished
            and not attempt.decoder.pending
        ):
            fast = self._take_token_chunk(chunk, len(line), whole_read=True)
            if fast is not None:
                return fast
        out: list[bytes] = []
        for data in attempt.decoder.feed(chunk):
            out += self.feed(data)
            if self._attempt is not attempt:
                break
        return b"".join(out)

    def feed(self, data: bytes) -> list[bytes]:
        """Take one upstream event payload of the attempt in flight (from `SseDecoder.feed`).

        Returns the SSE bytes to write to a streaming client now, rewritten so that the answer
        reads as one uninterrupted vLLM stream of the client's original request: `id`, `created`
        and `model` are those of the first chunk the client got; a continuation's completions
        chunks become chat chunks (`delta.content`) for a chat client; a restarted attempt's role
        chunk is dropped; token-id fields are null unless the client asked `return_token_ids`,
        and `prompt_token_ids` (the original prompt's, never a continuation's) is shown at most
        once; per-chunk `usage` (continuous usage stats) carries the true running totals;
        upstream usage chunks and `[DONE]` are swallowed (`final_events()` has the true ones).
        An upstream error event is passed through and ends the answer. A non-streaming client
        gets nothing here. `[DONE]` also ends the attempt.

        Raises UpstreamProtocolError on an event that is not vLLM's JSON; RuntimeError when no
        attempt is in flight.
        """
        attempt = self._attempt
        if attempt is None:
            raise RuntimeError("no upstream attempt is in flight")
        prefix = attempt.token_prefix
        if prefix is not None and data.startswith(prefix) and not self.finished:
            fast = self._take_token_chunk(data, len(prefix), whole_read=False)
            if fast is not None:
                return [fast] if fast else []
        # A JSON object cannot be [DONE]: most events skip is_done's strip and copy.
        if data[:1] != b"{" and is_done(data):
            self._end_attempt()
            return []
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise UpstreamProtocolError(f"an upstream event is not JSON: {data[:80]!r}") from exc
        if not isinstance(event, dict):
            raise UpstreamProtocolError("an upstream event is not a JSON object")
        choices = event.get("choices")
        if "error" in event and not choices:
            if self.finished:
                return []
            self.error = event
            self.finished = True
            return [sse_event(event)] if self.client_streams else []
        if not isinstance(choices, list):
            raise UpstreamProtocolError("an upstream event has no choices list")
        if not choices:
            self._take_usage(attempt, event)
            return []
        if len(choices) != 1 or not isinstance(choices[0], dict):
            raise UpstreamProtocolError("an upstream event has more than one choice")
        if self.finished:
            return []  # nothing may follow a finish but usage and [DONE]
        return self._take_chunk(attempt, event, choices[0])

    @property
    def prompt_ids_known(self) -> bool:
        """Whether the original prompt's token ids are known (the request's, the stream's, or
        `take_prompt_ids`')."""
        return self._prompt_ids is not None

    def take_prompt_ids(self, ids: Sequence[int]) -> None:
        """The original prompt's token ids as the engine's POST /tokenize gave them, for a text
        completion (vLLM 0.32 drops a stream's `prompt_token_ids` when its first chunk is empty,
        a prefill split over steps): what a continuation starts from once output was seen.
        Ignored where the ids are known already (a prompt of ids, or the stream's own); the
        stream's own, should they come later, replace these."""
        if self._prompt_ids is not None:
            return
        self._prompt_ids = list(ids)
        self._prompt_ids_tokenized = True
        attempt = self._attempt
        if attempt is not None and not attempt.continuation and attempt.prompt_tokens is None:
            attempt.prompt_tokens = len(self._prompt_ids)

    def pause(self) -> None:
        """The gateway paused the attempt in flight (closed its connection); what was received is
        kept and the next `upstream_request()` continues it. Raises RuntimeError unless
        `pausable()`: pausing then would lose output."""
        if not self.pausable():
            raise RuntimeError("pausing now would lose output")
        self.pauses += 1
        self._end_attempt()

    def attempt_ended(self) -> None:
        """The attempt in flight ended for any reason (connection lost, stream over); what was
        received is kept. Idempotent: does nothing when no attempt is in flight."""
        if self._attempt is not None:
            self._end_attempt()

    def final_events(self) -> list[bytes]:
        """For a streaming client, once `finished`: the events that end its stream: the usage
        chunk with the true totals (only if the client asked `include_usage`) and `[DONE]`; after
        an upstream error, only `[DONE]` (as vLLM). Raises RuntimeError before `finished` or for
        a non-streaming client."""
        if not self.client_streams:
            raise RuntimeError("the client did not ask for a stream")
        if not self.finished:
            raise RuntimeError("the answer is not finished")
        if self.error is not None:
            return [DONE_EVENT]
        events: list[bytes] = []
        if self._synthetic_finish:
            events.append(sse_event(self._client_chunk(text="", token_ids=[])))
        if self._client_usage:
            chunk: dict[str, Any] = {
                **self._identity_fields(),
                "choices": [],
                "usage": self._usage(),
            }
            if self._system_fingerprint is not None:
                chunk["system_fingerprint"] = self._system_fingerprint
            events.append(sse_event(chunk))
        events.append(DONE_EVENT)
        return events

    def response(self) -> dict[str, Any]:
        """For a non-streaming client, once `finished` without error: the one answer in vLLM's
        non-streamed shape (`text_completion` or `chat.completion`, every field vLLM dumps, null
        where vLLM has nothing), with the true usage. Raises RuntimeError before `finished` or
        after an error (answer `error` instead)."""
        if not self.finished:
            raise RuntimeError("the answer is not finished")
        if self.error is not None:
            raise RuntimeError("the answer ended with an upstream error")
        identity = self._identity_fields()
        text = "".join(self._text)
        token_ids = list(self._generated) if self._client_token_ids else None
        prompt_ids = self._prompt_ids if self._client_token_ids else None
        usage = self._usage()
        usage.setdefault("prompt_tokens_details", None)
        usage["completion_tokens_details"] = None
        common_tail = {
            "service_tier": None,
            "system_fingerprint": self._system_fingerprint,
            "usage": usage,
        }
        if not self._chat:
            return {
                "id": identity["id"],
                "object": "text_completion",
                "created": identity["created"],
                "model": identity["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": self.finish_reason,
                        "stop_reason": self.stop_reason,
                        "token_ids": token_ids,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt_ids,
                        "routed_experts": None,
                    }
                ],
                **common_tail,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        message = {
            "role": self._role or "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        return {
            "id": identity["id"],
            "object": "chat.completion",
            "created": identity["created"],
            "model": identity["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason or "stop",
                    "stop_reason": self.stop_reason,
                    "token_ids": token_ids,
                    "routed_experts": None,
                }
            ],
            **common_tail,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    # -- internals --

    def _continuable(self) -> bool:
        return (
            self._prompt_ids is not None
            and self._ids_complete
            and self._parsed_output is None
            and bool(self._generated)
        )

    def _original_body(self) -> dict[str, Any]:
        body = dict(self._body)
        if self._path == COMPLETIONS_PATH and "max_tokens" not in body:
            # vLLM's default, which the continuation counts down from, said to the engine: one
            # whose default differs would otherwise end elsewhere.
            body["max_tokens"] = self._max_output
        body["stream"] = True
        body["stream_options"] = {
            "include_usage": True,
            "continuous_usage_stats": self._continuous_usage,
        }
        body["return_token_ids"] = True
        if not self.client_streams:
            body.setdefault("stream_interval", ASSEMBLED_STREAM_INTERVAL)
        if self.attempts:
            # The engine may still be aborting the cut attempt under the client's request_id;
            # the client keeps seeing the first attempt's id anyway.
            body.pop("request_id", None)
        return body

    def _continuation_body(self) -> dict[str, Any]:
        assert self._prompt_ids is not None
        generated = len(self._generated)
        body: dict[str, Any] = {
            key: self._body[key] for key in _CONTINUATION_KEYS if key in self._body
        }
        body["prompt"] = [*self._prompt_ids, *self._generated]
        body["max_tokens"] = self._max_output - generated
        body["min_tokens"] = max(0, self._min_tokens - generated)
        body["stream"] = True
        body["stream_options"] = {
            "include_usage": True,
            "continuous_usage_stats": self._continuous_usage,
        }
        body["return_token_ids"] = True
        if not self.client_streams:
            body.setdefault("stream_interval", ASSEMBLED_STREAM_INTERVAL)
        return body

    def _restart(self) -> None:
        if self.client_streams and self._client_saw_output:
            raise CannotResume(
                "the output so far cannot be continued exactly and the client has seen it"
            )
        self.discarded_output_tokens += self.generated_tokens
        self._generated = []
        self._text = []
        self._output_seen = False
        self._ids_complete = True
        self._parsed_output = None
        self._last_usage = None

    def _end_attempt(self) -> None:
        attempt = self._attempt
        assert attempt is not None
        self._attempt = None
        self.in_flight = False
        if not self.finished and self._continuable() and len(self._generated) >= self._max_output:
            # Every token asked for arrived but the finishing chunk did not (vLLM sends them
            # together, so only a cut in between gets here): finish as vLLM would have.
            self.finished = True
            self.finish_reason = "length"
            self._synthetic_finish = self.client_streams

    def _take_usage(self, attempt: _Attempt, event: dict[str, Any]) -> None:
        usage = event.get("usage")
        if not isinstance(usage, dict):
            return
        if event.get("system_fingerprint") is not None:
            self._system_fingerprint = event["system_fingerprint"]
        self._last_usage = usage
        self._last_usage_continuation = attempt.continuation
        if not attempt.continuation:
            self._original_usage = usage
        if attempt.prompt_tokens is None:
            attempt.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        if attempt.recomputes and not attempt.waste_counted:
            attempt.waste_counted = True
            prompt = int(usage.get("prompt_tokens") or 0)
            self.recomputed_prompt_tokens += max(0, prompt - (_cached_tokens(usage) or 0))

    def _take_chunk(
        self, attempt: _Attempt, event: dict[str, Any], choice: dict[str, Any]
    ) -> list[bytes]:
        self._prefill_done = True
        if self._identity is None:
            self._identity = {
                "id": event.get("id"),
                "created": event.get("created"),
                "model": event.get("model"),
            }
            self._client_identity = None
        role: Any = None
        if attempt.upstream_chat:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                raise UpstreamProtocolError("a chat chunk has no delta object")
            role = delta.get("role")
            parsed = any(delta.get(key) for key in ("reasoning", "reasoning_content", "tool_calls"))
            if parsed or (role is None and "content" not in delta):
                # The server parses this chat's output (without a parser vLLM sends every
                # token's text as `content`, even ""; a parser holding text back sends `{}`).
                # A continuation on /v1/completions would deliver the raw tokens as content.
                self._parsed_output = "the engine parses this chat's output"
            text = delta.get("content") or ""
            prompt_ids = event.get("prompt_token_ids")
        else:
            text = choice.get("text") or ""
            prompt_ids = choice.get("prompt_token_ids")
        if not isinstance(text, str):
            raise UpstreamProtocolError("a chunk's text is not a string")
        if role is not None:
            self._role = str(role)
        if (
            prompt_ids is not None
            and not attempt.continuation
            and (self._prompt_ids is None or self._prompt_ids_tokenized)
        ):
            if not _int_list(prompt_ids):
                raise UpstreamProtocolError("prompt_token_ids is not a list of integers")
            if attempt.prompt_tokens is None or self._prompt_ids_tokenized:
                attempt.prompt_tokens = len(prompt_ids)
            self._prompt_ids = list(prompt_ids)
            self._prompt_ids_tokenized = False
        token_ids = choice.get("token_ids")
        if token_ids is None:
            if role is None:
                self._ids_complete = False
            token_ids = []
        elif not _int_list(token_ids):
            raise UpstreamProtocolError("token_ids is not a list of integers")
        self._generated.extend(token_ids)
        self._text.append(text)
        has_output = bool(text or token_ids)
        self._output_seen = self._output_seen or has_output
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            self.finished = True
            self.finish_reason = str(finish_reason)
            self.stop_reason = choice.get("stop_reason")
        if attempt.token_prefix is None and not attempt.upstream_chat and not self._chat:
            attempt.token_prefix = _token_prefix(event)
            if attempt.token_prefix is not None:
                attempt.token_line = b"data: " + attempt.token_prefix
        if not self.client_streams:
            return []
        if role is not None:
            if self._role_sent:
                return []  # a restarted attempt's role chunk: the client has had it
            self._role_sent = True
        self._client_saw_output = self._client_saw_output or has_output
        if attempt.upstream_chat == self._chat:
            out = self._rewrite(attempt, event, choice)
        else:
            out = self._client_chunk(text=text, token_ids=token_ids)
            if event.get("usage") is not None:
                out["usage"] = self._running_usage()
        return [sse_event(out)]

    def _take_token_chunk(self, data: bytes, text_at: int, *, whole_read: bool) -> bytes | None:
        """What `_take_chunk` does with a completions token chunk of the attempt's own prefix
        and the shape `_TOKEN_CHUNK` (no finish, no usage, no prompt ids) for a completions
        client, read from the bytes without decoding the whole event: only its token ids are
        parsed (and its text, for a client that gets one assembled answer), and the client's
        event is the upstream's bytes with the client's identity and token ids spliced in.
        `data` is an event's payload, or with `whole_read` a whole read that must be that one
        event (`data: `, the payload, a blank line). None when `data` has not that shape (the
        caller then decodes it as any other event): then nothing was changed.

        A streaming client's text goes as the engine encoded it, unread, as any relayed byte
        does; what bounds it is JSON's: a string holds no `,"` (its quotes are escaped), so the
        first `,"logprobs":` after the text's opening quote follows its closing one."""
        # A short needle: CPython's search prepares its whole needle on every call.
        middle = data.find(_TOKEN_MIDDLE_START, text_at)
        if (
            middle < 0
            or data[text_at] != _QUOTE
            or data[middle - 1] != _QUOTE
            or not data.startswith(_TOKEN_MIDDLE, middle)
        ):
            return None
        ids_at = middle + _TOKEN_MIDDLE_BYTES
        ids_end = data.find(b"]", ids_at) + 1
        tail = data[ids_end:]
        if ids_end <= 0 or tail not in (_TOKEN_LINE_TAILS if whole_read else _TOKEN_TAILS):
            return None
        ids = data[ids_at - 1 : ids_end]
        streams = self.client_streams
        try:
            token_ids = orjson.loads(ids)  # a list: its bytes open with `[` and close with `]`
            text: Any = "" if streams else orjson.loads(data[text_at:middle])
        except orjson.JSONDecodeError:
            return None
        # `_int_list` without its call: orjson makes exact ints, never a subclass.
        for token_id in token_ids:
            if type(token_id) is not int:
                return None
        if type(text) is not str:
            return None
        self._prefill_done = True
        self._generated.extend(token_ids)
        has_output = bool(token_ids) or middle - text_at > 2
        self._output_seen = self._output_seen or has_output
        if not streams:
            self._text.append(text)
            return b""
        self._client_saw_output = self._client_saw_output or has_output
        own = self._attempt.token_prefix if self._attempt is not None else None
        prefix = self._client_token_prefix
        if prefix is None:
            prefix = _token_prefix(self._identity_fields())
            if prefix is None:
                return None  # not reached: the identity came from a chunk that was encoded
            # The same object where it is this attempt's own: `is` tells it below.
            prefix = self._client_token_prefix = own if prefix == own else prefix
        shown = ids if self._client_token_ids else b"null"
        # A whole read's tail holds the event's blank line (and so no other event: a JSON text
        # holds no raw line end, and what precedes the tail was read).
        if whole_read and prefix is own:
            # The client's identity is this attempt's own (no pause so far): the engine's
            # bytes as they are, less the token ids where the client did not ask for them.
            return data if shown is ids else b"".join((data[: ids_at - 1], shown, tail))
        end = b"" if whole_read else b"\n\n"
        return b"".join((b"data: ", prefix, data[text_at : ids_at - 1], shown, tail, end))

    def _rewrite(
        self, attempt: _Attempt, event: dict[str, Any], choice: dict[str, Any]
    ) -> dict[str, Any]:
        """An upstream chunk of the client's own kind, rewritten for the client: `event` itself,
        changed in place (it is this module's own, fresh from the decoder, and `choice` is its
        only choice), which costs a relayed event no copies."""
        event.update(self._identity_fields())
        if not self._client_token_ids and "token_ids" in choice:
            choice["token_ids"] = None
        holder = event if self._chat else choice
        if holder.get("prompt_token_ids") is not None:
            show = self._client_token_ids and not self._prompt_ids_shown
            holder["prompt_token_ids"] = self._prompt_ids if show else None
            self._prompt_ids_shown = self._prompt_ids_shown or show
        if event.get("usage") is not None:
            event["usage"] = self._running_usage()
        return event

    def _client_chunk(self, *, text: str, token_ids: list[int]) -> dict[str, Any]:
        """A chunk of the client's kind built from scratch (vLLM's keys, exclude_unset)."""
        ids = list(token_ids) if self._client_token_ids else None
        finishing = self.finished and self.finish_reason is not None
        if not self._chat:
            prompt_ids = None
            if self._client_token_ids and not self._prompt_ids_shown and token_ids:
                prompt_ids, self._prompt_ids_shown = self._prompt_ids, True
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": self.finish_reason if finishing else None,
                "stop_reason": self.stop_reason if finishing else None,
                "prompt_token_ids": prompt_ids,
                "token_ids": ids,
            }
        else:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": self.finish_reason if finishing else None,
            }
            if finishing:
                choice["stop_reason"] = self.stop_reason
            choice["token_ids"] = ids
        return {**self._identity_fields(), "choices": [choice]}

    def _identity_fields(self) -> Mapping[str, Any]:
        """`id`, `object`, `created` and `model` of the client's chunks (shared: not to be
        changed; built once, since every relayed event gets them)."""
        if self._client_identity is not None:
            return self._client_identity
        identity = self._identity or {"id": None, "created": None, "model": None}
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        fields = {
            "id": identity["id"],
            "object": obj,
            "created": identity["created"],
            "model": identity["model"],
        }
        if self._identity is not None:
            self._client_identity = fields
        return fields

    def _running_usage(self) -> dict[str, Any]:
        prompt = self.prompt_tokens or 0
        completion = self.generated_tokens
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }

    def _usage(self) -> dict[str, Any]:
        usage = self._running_usage()
        last = self._last_usage
        details = last.get("prompt_tokens_details") if last is not None else None
        if last is not None and isinstance(details, dict):
            if not self._last_usage_continuation:
                usage["prompt_tokens_details"] = details
            else:
                # A continuation's cache hits cover the original prompt first (it is a prefix):
                # the original prompt's tokens found in cache by the attempt that finished.
                cached = min(_cached_tokens(last) or 0, usage["prompt_tokens"])
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage


def _output_bound(path: str, body: Mapping[str, Any]) -> int:
    if path == COMPLETIONS_PATH:
        value = body.get("max_tokens")
        return COMPLETIONS_DEFAULT_MAX_TOKENS if value is None else int(value)
    value = body.get("max_completion_tokens")
    if value is None:
        value = body.get("max_tokens")
    # not_resumable has made sure one of them is a count.
    return int(value or 0)


def _prompt_ids_of(path: str, body: Mapping[str, Any]) -> list[int] | None:
    if path != COMPLETIONS_PATH:
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    return list(prompt) if _int_list(prompt) and prompt else None


# A completions token chunk as vLLM 0.32 writes it (CompletionStreamResponse, compact JSON):
# {"id":..,"object":"text_completion","created":..,"model":..,"choices":[{"index":0,"text":..,
# then _TOKEN_MIDDLE, the token ids, and one of _TOKEN_TAILS. Any other chunk is decoded whole.
_TOKEN_MIDDLE: Final = (
    b',"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
    b'"token_ids":['
)
_TOKEN_MIDDLE_START: Final = _TOKEN_MIDDLE[: len(b',"logprobs":')]
_TOKEN_MIDDLE_BYTES: Final = len(_TOKEN_MIDDLE)
_QUOTE: Final = ord('"')
_TOKEN_TAILS: Final = (b"}]}", b'}],"usage":null}')
_TOKEN_LINE_TAILS: Final = tuple(tail + b"\n\n" for tail in _TOKEN_TAILS)


def _token_prefix(identity: Mapping[str, Any]) -> bytes | None:
    """How a completions token chunk of this identity (`id`, `created`, `model`) begins, up to
    its text; None when a value does not encode as JSON."""
    try:
        return (
            b'{"id":'
            + orjson.dumps(identity.get("id"))
            + b',"object":"text_completion","created":'
            + orjson.dumps(identity.get("created"))
            + b',"model":'
            + orjson.dumps(identity.get("model"))
            + b',"choices":[{"index":0,"text":'
        )
    except orjson.JSONEncodeError:
        return None


def _cached_tokens(usage: Mapping[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return None
    cached = details.get("cached_tokens")
    return int(cached) if isinstance(cached, int) else None


def _int_list(value: Any) -> bool:
    if not isinstance(value, list):
        return False
    # A loop, not all() over a generator: this runs on every relayed event's token ids.
    for item in value:
        if type(item) is not int and (not isinstance(item, int) or isinstance(item, bool)):
            return False
    return True


def _dumps(payload: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as vLLM writes its events (orjson: this runs once per relayed event
    of a resumable stream, at a fifth of the json module's cost)."""
    return orjson.dumps(payload)
