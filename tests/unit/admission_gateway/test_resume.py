"""Transparent resume: which shapes resume, SSE decoding, and one answer across cut attempts.

`FakeVllm` below answers as vLLM 0.32 does (the chunk shapes of
vllm/entrypoints/openai/{completion,chat_completion}/serving.py), with a next token that is a
function of the context alone, so a continuation is the same computation as an uncut request and
"equal to a request never paused" can be checked exactly.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission_gateway.resume import (
    ASSEMBLED_STREAM_INTERVAL,
    CHAT_PATH,
    COMPLETIONS_PATH,
    SSE_KEEPALIVE,
    CannotResume,
    Resumption,
    SseDecoder,
    SseTooLong,
    UpstreamProtocolError,
    is_done,
    not_resumable,
)

# --- a vLLM-shaped engine ----------------------------------------------------------------------

VOCAB = 40
EOS = 0
TEXTS = ["", *(chr(ord("a") + t % 26) * (1 + t % 3) for t in range(1, VOCAB - 1)), " é"]


def next_token(context: Sequence[int]) -> int:
    return (sum(context[-3:]) * 31 + len(context) * 7 + context[-1] * 13) % VOCAB


def tokenize(text: str) -> list[int]:
    return [1 + ord(char) % (VOCAB - 1) for char in text]


def render_chat(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    ids: list[int] = []
    for message in messages:
        ids += tokenize(f"<{message['role']}>{message.get('content') or ''}")
    return [*ids, 3, 4]  # the generation prompt


class FakeVllm:
    """Streams (or answers) a request the way vLLM 0.32 does, from a deterministic model."""

    def __init__(
        self, *, prompt_details: bool = False, cached: int = 0, compact: bool = False
    ) -> None:
        self.calls = 0
        self.prompt_details = prompt_details
        self.cached = cached
        self.separators = (",", ":") if compact else None
        """Compact JSON is what vLLM writes (and what the gateway reads without decoding)."""
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def _prompt(self, path: str, body: Mapping[str, Any]) -> list[int]:
        if path == CHAT_PATH:
            return render_chat(body["messages"])
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        return tokenize(prompt) if isinstance(prompt, str) else list(prompt)

    def _generate(
        self, prompt: list[int], body: Mapping[str, Any], default_max: int
    ) -> tuple[list[int], str, int | None]:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
        min_tokens = body.get("min_tokens") or 0
        stops = set(body.get("stop_token_ids") or [])
        ignore_eos = bool(body.get("ignore_eos"))
        context, out = list(prompt), []
        for step in range(max_tokens):
            token = next_token(context)
            # min_tokens masks the stopping tokens: the next one of the vocabulary is taken.
            while step < min_tokens and ((token == EOS and not ignore_eos) or token in stops):
                token = (token + 1) % VOCAB
            out.append(token)
            context.append(token)
            if token in stops:
                return out, "stop", token
            if token == EOS and not ignore_eos:
                return out, "stop", None
        return out, "length", None

    def _head(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.requests.append((path, dict(body)))
        self.calls += 1
        chat = path == CHAT_PATH
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.calls}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1000 + self.calls,
            "model": body.get("model") or "m",
        }

    def _usage(self, prompt: int, completion: int) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }
        if self.prompt_details:
            usage["prompt_tokens_details"] = {"cached_tokens": min(self.cached, prompt)}
        return usage

    def stream(self, path: str, body: Mapping[str, Any]) -> list[bytes]:
        """The event payloads of a streamed request, `[DONE]` last."""
        head = self._head(path, body)
        chat = path == CHAT_PATH
        prompt = self._prompt(path, body)
        out, finish, stop_reason = self._generate(prompt, body, 16)
        ids = bool(body.get("return_token_ids"))
        options = body.get("stream_options") or {}
        usage_on = bool(options.get("include_usage"))
        continuous = usage_on and bool(options.get("continuous_usage_stats"))
        events: list[dict[str, Any]] = []
        if chat:
            role: dict[str, Any] = {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "prompt_token_ids": prompt if ids else None,
                "prompt_text": None,
            }
            if continuous:
                role["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": 0}
                role["usage"]["total_tokens"] = len(prompt)
            events.append(role)
        for step, token in enumerate(out):
            last = step == len(out) - 1
            text = "" if token in (EOS, stop_reason) else TEXTS[token]
            choice: dict[str, Any]
            if chat:
                choice = {
                    "index": 0,
                    "delta": {"content": text},
                    "logprobs": None,
                    "finish_reason": finish if last else None,
                }
                if last:
                    choice["stop_reason"] = stop_reason
                choice["token_ids"] = [token] if ids else None
            else:
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish if last else None,
                    "stop_reason": stop_reason if last else None,
                    "prompt_token_ids": prompt if ids and step == 0 else None,
                    "token_ids": [token] if ids else None,
                }
            chunk = {**head, "choices": [choice]}
            if continuous:
                chunk["usage"] = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": step + 1,
                    "total_tokens": len(prompt) + step + 1,
                }
            events.append(chunk)
        if usage_on:
            events.append({**head, "choices": [], "usage": self._usage(len(prompt), len(out))})
        encoded = [json.dumps(event, separators=self.separators).encode() for event in events]
        return [*encoded, b"[DONE]"]

    def complete(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The non-streamed answer, every field vLLM's model_dump() writes."""
        head = self._head(path, body)
        prompt = self._prompt(path, body)
        out, finish, stop_reason = self._generate(prompt, body, 16)
        ids = bool(body.get("return_token_ids"))
        text = "".join("" if token in (EOS, stop_reason) else TEXTS[token] for token in out)
        usage = self._usage(len(prompt), len(out))
        usage.setdefault("prompt_tokens_details", None)
        usage["completion_tokens_details"] = None
        tail = {"service_tier": None, "system_fingerprint": None, "usage": usage}
        if path == COMPLETIONS_PATH:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": out if ids else None,
                "prompt_logprobs": None,
                "prompt_token_ids": prompt if ids else None,
                "routed_experts": None,
            }
            extra: dict[str, Any] = {}
        else:
            message = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": out if ids else None,
                "routed_experts": None,
            }
            extra = {
                "prompt_logprobs": None,
                "prompt_token_ids": prompt if ids else None,
                "prompt_text": None,
            }
        head["object"] = "chat.completion" if path == CHAT_PATH else "text_completion"
        return {
            **head,
            "choices": [choice],
            **tail,
            **extra,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }


def sse(payloads: Sequence[bytes]) -> bytes:
    return b"".join(b"data: " + payload + b"\n\n" for payload in payloads)


def parse_client(stream: bytes) -> list[Any]:
    """The client's events: JSON objects, and the string "[DONE]"."""
    decoder = SseDecoder()
    payloads = decoder.feed(stream)
    assert not decoder.pending
    return ["[DONE]" if is_done(p) else json.loads(p) for p in payloads]


def run(
    engine: FakeVllm,
    path: str,
    body: Mapping[str, Any],
    cuts: Sequence[int] = (),
    rng: random.Random | None = None,
    *,
    aligned: bool = False,
) -> tuple[Resumption, bytes]:
    """The gateway's loop: attempts cut after `cuts[i]` events each, then one run to the end.

    The upstream bytes (with keep-alive comments and, at a cut, half an event that never ends)
    are split at random points, as a real connection may deliver them, or with `aligned` read
    an event at a time, as vLLM's usually come (the relay's byte-level path takes those).
    """
    rng = rng or random.Random(0)
    resumption = Resumption(path, body)
    client = bytearray()
    pending_cuts = list(cuts)
    while not resumption.finished:
        upstream_path, upstream_body = resumption.upstream_request()
        events = engine.stream(upstream_path, json.loads(upstream_body))
        cut = pending_cuts.pop(0) if pending_cuts else None
        reads = [SSE_KEEPALIVE, *(sse([event]) for event in events[:cut])]
        if cut is not None and cut < len(events):
            reads.append(sse(events[cut : cut + 1])[: rng.randrange(1, 8)])
        if not aligned:
            wire = b"".join(reads)
            steps = [0]
            while steps[-1] < len(wire):
                steps.append(steps[-1] + rng.randrange(1, 40))
            reads = [wire[start:end] for start, end in itertools.pairwise(steps)]
        for read in reads:
            client += resumption.relay(read)
        if not resumption.finished:
            # This engine returns every token id: pausing never loses anything.
            assert resumption.pausable()
            resumption.pause()
        else:
            resumption.attempt_ended()
    if resumption.client_streams:
        client += b"".join(resumption.final_events())
    return resumption, bytes(client)


# --- not_resumable: a test per shape -----------------------------------------------------------

CHAT_MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def completions(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hello", "max_tokens": 8, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": CHAT_MESSAGES, "max_tokens": 8, **extra}


RESUMABLE = [
    pytest.param(COMPLETIONS_PATH, completions(), id="completions-string-prompt"),
    pytest.param(COMPLETIONS_PATH, completions(prompt=[5, 6, 7]), id="completions-token-ids"),
    pytest.param(COMPLETIONS_PATH, completions(prompt=["hello"]), id="completions-one-string"),
    pytest.param(COMPLETIONS_PATH, completions(prompt=[[5, 6]]), id="completions-one-id-list"),
    pytest.param(COMPLETIONS_PATH, {"prompt": "x"}, id="completions-default-max-tokens-bounds-it"),
    pytest.param(
        COMPLETIONS_PATH,
        completions(
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            temperature=0.7,
            top_p=0.9,
            top_k=20,
            min_p=0.05,
            repetition_penalty=1.1,
            presence_penalty=0,
            frequency_penalty=0.0,
            logit_bias={"5": -1.0},
            ignore_eos=True,
            min_tokens=2,
            stop_token_ids=[7],
            skip_special_tokens=False,
            return_token_ids=True,
            priority=-1,
            cache_salt="salt",
            user="u",
            n=1,
            echo=False,
            stop=[],
        ),
        id="completions-every-exact-sampling-key",
    ),
    pytest.param(
        COMPLETIONS_PATH,
        completions(seed=None, stop=None, suffix=None, logprobs=None, stream_options=None),
        id="completions-nulls-are-absent",
    ),
    pytest.param(CHAT_PATH, chat(), id="chat-max-tokens"),
    pytest.param(
        CHAT_PATH,
        {"messages": CHAT_MESSAGES, "max_completion_tokens": 8},
        id="chat-max-completion-tokens",
    ),
    pytest.param(
        CHAT_PATH,
        chat(
            stream=True,
            response_format={"type": "text"},
            tool_choice="none",
            reasoning_effort="none",
            chat_template_kwargs={"enable_thinking": False},
            include_reasoning=True,
            logprobs=False,
            top_logprobs=0,
        ),
        id="chat-explicit-defaults-that-disable-features",
    ),
    pytest.param(
        CHAT_PATH,
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
        id="chat-text-content-parts",
    ),
]


@pytest.mark.parametrize(("path", "body"), RESUMABLE)
def test_resumable_shapes(path: str, body: dict[str, Any]) -> None:
    assert not_resumable(path, body) is None


EXCLUDED = [
    pytest.param("/v1/embeddings", {"input": "x"}, "route", id="other-route"),
    pytest.param(COMPLETIONS_PATH, completions(prompt=["a", "b"]), "one prompt", id="batch"),
    pytest.param(COMPLETIONS_PATH, completions(prompt=[[1], [2]]), "one prompt", id="id-batch"),
    pytest.param(COMPLETIONS_PATH, completions(prompt=""), "one prompt", id="empty-prompt"),
    pytest.param(COMPLETIONS_PATH, completions(prompt_embeds="..."), "embeddings", id="embeds"),
    pytest.param(COMPLETIONS_PATH, completions(seed=1), "seed", id="seed"),
    pytest.param(COMPLETIONS_PATH, completions(stop=["\n"]), "stop strings", id="stop-list"),
    pytest.param(COMPLETIONS_PATH, completions(stop="\n"), "stop strings", id="stop-string"),
    pytest.param(COMPLETIONS_PATH, completions(echo=True), "echo", id="echo"),
    pytest.param(COMPLETIONS_PATH, completions(suffix="end"), "suffix", id="suffix"),
    pytest.param(COMPLETIONS_PATH, completions(logprobs=0), "logprobs", id="logprobs-zero"),
    pytest.param(COMPLETIONS_PATH, completions(prompt_logprobs=1), "logprobs", id="prompt-lp"),
    pytest.param(
        COMPLETIONS_PATH, completions(presence_penalty=0.5), "output tokens", id="presence"
    ),
    pytest.param(
        COMPLETIONS_PATH, completions(frequency_penalty=-1), "output tokens", id="frequency"
    ),
    pytest.param(COMPLETIONS_PATH, completions(n=2), "n > 1", id="n"),
    pytest.param(COMPLETIONS_PATH, completions(best_of=3), "best_of", id="best-of"),
    pytest.param(COMPLETIONS_PATH, completions(use_beam_search=True), "beam", id="beam"),
    pytest.param(
        COMPLETIONS_PATH,
        completions(response_format={"type": "json_object"}),
        "structured",
        id="json-object",
    ),
    pytest.param(
        COMPLETIONS_PATH, completions(structured_outputs={"regex": "a+"}), "grammar", id="so"
    ),
    pytest.param(COMPLETIONS_PATH, completions(guided_json={}), "grammar", id="guided-json"),
    pytest.param(
        COMPLETIONS_PATH, completions(truncate_prompt_tokens=4), "truncation", id="truncate"
    ),
    pytest.param(COMPLETIONS_PATH, completions(bad_words=["x"]), "bad words", id="bad-words"),
    pytest.param(COMPLETIONS_PATH, completions(vllm_xargs={}), "not on the", id="unknown-key"),
    pytest.param(
        COMPLETIONS_PATH,
        completions(stream_options={"include_usage": True}),
        "without 'stream'",
        id="stream-options-without-stream",
    ),
    pytest.param(
        COMPLETIONS_PATH,
        completions(stream=True, stream_options={"foo": True}),
        "not on the",
        id="unknown-stream-option",
    ),
    pytest.param(CHAT_PATH, {"messages": CHAT_MESSAGES}, "not bounded", id="chat-unbounded"),
    pytest.param(CHAT_PATH, chat(tools=[{"type": "function"}]), "tool", id="chat-tools"),
    pytest.param(CHAT_PATH, chat(tool_choice="auto"), "tool", id="chat-tool-choice"),
    pytest.param(
        CHAT_PATH,
        chat(response_format={"type": "json_schema", "json_schema": {}}),
        "structured",
        id="chat-json-schema",
    ),
    pytest.param(CHAT_PATH, chat(reasoning_effort="high"), "reasoning", id="reasoning-effort"),
    pytest.param(CHAT_PATH, chat(include_reasoning=False), "hidden", id="include-reasoning"),
    pytest.param(
        CHAT_PATH,
        chat(chat_template_kwargs={"enable_thinking": True}),
        "reasoning",
        id="thinking-on",
    ),
    pytest.param(CHAT_PATH, chat(reasoning={"effort": "low"}), "reasoning", id="reasoning"),
    pytest.param(CHAT_PATH, chat(logprobs=True), "logprobs", id="chat-logprobs"),
    pytest.param(CHAT_PATH, chat(top_logprobs=2), "logprobs", id="chat-top-logprobs"),
    pytest.param(CHAT_PATH, chat(seed=7), "seed", id="chat-seed"),
    pytest.param(CHAT_PATH, chat(stop=["."]), "stop strings", id="chat-stop"),
    pytest.param(CHAT_PATH, chat(n=3), "n > 1", id="chat-n"),
    pytest.param(CHAT_PATH, chat(echo=True), "echo", id="chat-echo"),
    pytest.param(
        CHAT_PATH, chat(presence_penalty=1.0), "output tokens", id="chat-presence-penalty"
    ),
    pytest.param(CHAT_PATH, chat(use_beam_search=True), "beam", id="chat-beam"),
    pytest.param(
        CHAT_PATH,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "text content",
        id="chat-image",
    ),
    pytest.param(
        CHAT_PATH,
        chat(messages=[{"role": "tool", "content": "42", "tool_call_id": "c"}]),
        "only role, content",
        id="chat-tool-message",
    ),
    pytest.param(
        CHAT_PATH,
        chat(messages=[{"role": "assistant", "content": "a", "reasoning": "r"}]),
        "only role, content",
        id="chat-reasoning-in-history",
    ),
]


@pytest.mark.parametrize(("path", "body", "reason"), EXCLUDED)
def test_excluded_shapes_say_why(path: str, body: dict[str, Any], reason: str) -> None:
    why = not_resumable(path, body)
    assert why is not None
    assert reason in why


def test_a_completions_explicit_null_max_tokens_is_not_resumable() -> None:
    # vLLM reads a null max_tokens as "up to the context limit", which the gateway cannot
    # count down from; an absent one is vLLM's default of 16.
    why = not_resumable(COMPLETIONS_PATH, {**completions(), "max_tokens": None})
    assert why is not None and "context length" in why
    absent = {k: v for k, v in completions().items() if k != "max_tokens"}
    assert not_resumable(COMPLETIONS_PATH, absent) is None
    _, first = upstream(Resumption(COMPLETIONS_PATH, absent))
    assert first["max_tokens"] == 16, "the engine is told the bound the gateway counts from"


def test_a_shape_that_does_not_resume_is_refused_by_resumption() -> None:
    with pytest.raises(ValueError, match="seed"):
        Resumption(COMPLETIONS_PATH, completions(seed=1))


# --- SseDecoder --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        pytest.param(b"data: a\n\ndata: b\n\n", [b"a", b"b"], id="lf"),
        pytest.param(b"data: a\r\n\r\ndata: b\r\n\r\n", [b"a", b"b"], id="crlf"),
        pytest.param(b": keep-alive\n\ndata: a\n\n", [b"a"], id="comment-is-no-event"),
        pytest.param(b"event: x\nid: 3\ndata: a\n\n", [b"a"], id="other-fields-ignored"),
        pytest.param(b"data: a\ndata: b\n\n", [b"a\nb"], id="multi-line-data"),
        pytest.param(b"data:a\n\n", [b"a"], id="no-space"),
        pytest.param(b"data: [DONE]\n\n", [b"[DONE]"], id="done"),
        pytest.param(b"data: a\n\ndata: b", [b"a"], id="unfinished-event-held"),
    ],
)
def test_sse_decoder_yields_complete_payloads(wire: bytes, expected: list[bytes]) -> None:
    assert SseDecoder().feed(wire) == expected


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_sse_decoder_is_indifferent_to_where_the_bytes_are_split(cuts: list[int]) -> None:
    wire = b": hi\r\n\r\n" + sse([b'{"a": 1}', b'{"b": "\xc3\xa9"}', b"[DONE]"])
    decoder = SseDecoder()
    payloads: list[bytes] = []
    previous = 0
    for cut in [*sorted(c % (len(wire) + 1) for c in cuts), len(wire)]:
        payloads += decoder.feed(wire[previous:cut])
        previous = cut
    assert payloads == [b'{"a": 1}', b'{"b": "\xc3\xa9"}', b"[DONE]"]
    assert not decoder.pending


_SSE_LINES = st.sampled_from(
    [b"data: {}", b"data:x", b"data: [DONE]", b"data: a\r", b": c", b"event: e", b"", b"\r"]
)


@given(st.lists(st.lists(_SSE_LINES, max_size=3), max_size=6), st.booleans())
def test_sse_decoder_reads_whole_events_as_it_reads_them_byte_by_byte(
    events: list[list[bytes]], crlf: bool
) -> None:
    # Whole events in one read take a shortcut; what they yield must not differ.
    end = b"\r\n" if crlf else b"\n"
    wire = b"".join(b"".join(line + end for line in lines) + end for lines in events)
    whole = SseDecoder()
    one_by_one = SseDecoder()
    expected = [p for i in range(len(wire)) for p in one_by_one.feed(wire[i : i + 1])]
    assert whole.feed(wire) == expected
    assert whole.pending == one_by_one.pending


def test_sse_decoder_reports_a_cut_event_and_bounds_memory() -> None:
    decoder = SseDecoder(max_event_bytes=64)
    assert decoder.feed(b"data: {") == []
    assert decoder.pending
    with pytest.raises(SseTooLong):
        decoder.feed(b"x" * 100)


def test_is_done_tells_the_end_of_stream() -> None:
    assert is_done(b"[DONE]")
    assert not is_done(b'{"choices": []}')


# --- upstream requests -------------------------------------------------------------------------


def upstream(resumption: Resumption) -> tuple[str, dict[str, Any]]:
    path, body = resumption.upstream_request()
    return path, json.loads(body)


def test_the_first_attempt_is_the_original_streamed_with_usage_and_token_ids() -> None:
    body = completions(temperature=0.5, request_id="r1")
    path, first = upstream(Resumption(COMPLETIONS_PATH, body))
    assert path == COMPLETIONS_PATH
    assert first == {
        **body,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": False},
        "return_token_ids": True,
        # The client reads one assembled answer: no need for a chunk a token upstream.
        "stream_interval": ASSEMBLED_STREAM_INTERVAL,
    }


def test_a_streaming_clients_chunks_are_its_own() -> None:
    body = completions(stream=True, temperature=0.5)
    _, first = upstream(Resumption(COMPLETIONS_PATH, body))
    assert "stream_interval" not in first
    body["stream_interval"] = 4
    _, first = upstream(Resumption(COMPLETIONS_PATH, {**body, "stream": False}))
    assert first["stream_interval"] == 4


def test_the_clients_continuous_usage_stats_are_kept() -> None:
    body = completions(stream=True, stream_options={"include_usage": True})
    body["stream_options"]["continuous_usage_stats"] = True
    _, first = upstream(Resumption(COMPLETIONS_PATH, body))
    assert first["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def cut_after(resumption: Resumption, engine: FakeVllm, events: int) -> list[bytes]:
    path, body = resumption.upstream_request()
    out: list[bytes] = []
    for payload in engine.stream(path, json.loads(body))[:events]:
        out += resumption.feed(payload)
    resumption.pause()
    return out


def test_a_chat_continues_on_completions_with_the_tokens_so_far() -> None:
    body = chat(
        max_completion_tokens=10,
        min_tokens=5,
        temperature=0.3,
        top_k=5,
        ignore_eos=True,
        cache_salt="s",
        priority=2,
        request_id="client-id",
        add_generation_prompt=True,
    )
    engine = FakeVllm()
    resumption = Resumption(CHAT_PATH, body)
    cut_after(resumption, engine, 4)  # the role chunk and three tokens
    path, continuation = upstream(resumption)
    prompt = render_chat(CHAT_MESSAGES)
    assert path == COMPLETIONS_PATH
    generated = continuation["prompt"][len(prompt) :]
    assert continuation["prompt"][: len(prompt)] == prompt
    assert len(generated) == 3 == resumption.generated_tokens
    assert continuation == {
        "model": "m",
        "temperature": 0.3,
        "top_k": 5,
        "ignore_eos": True,
        "priority": 2,
        "cache_salt": "s",
        "prompt": [*prompt, *generated],
        "max_tokens": 7,
        "min_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": False},
        "return_token_ids": True,
        "stream_interval": ASSEMBLED_STREAM_INTERVAL,
    }


def test_min_tokens_never_goes_below_zero() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(max_tokens=20, min_tokens=2))
    cut_after(resumption, FakeVllm(), 5)
    _, continuation = upstream(resumption)
    assert continuation["min_tokens"] == 0
    assert continuation["max_tokens"] == 15


def test_a_cut_before_any_token_sends_the_original_again_without_its_request_id() -> None:
    body = chat(stream=True, request_id="client-id")
    resumption = Resumption(CHAT_PATH, body)
    engine = FakeVllm()
    sent = cut_after(resumption, engine, 1)  # only the role chunk
    assert len(sent) == 1
    path, again = upstream(resumption)
    assert path == CHAT_PATH
    assert "request_id" not in again
    assert again["messages"] == CHAT_MESSAGES
    # The restarted attempt's role chunk is not shown twice.
    events = engine.stream(path, again)
    assert resumption.feed(events[0]) == []
    assert resumption.feed(events[1]) != []


def test_only_one_attempt_at_a_time_and_none_after_the_finish() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(max_tokens=1))
    path, body = resumption.upstream_request()
    with pytest.raises(RuntimeError, match="in flight"):
        resumption.upstream_request()
    for payload in FakeVllm().stream(path, json.loads(body)):
        resumption.feed(payload)
    assert resumption.finished and not resumption.in_flight
    assert not resumption.pausable()
    with pytest.raises(RuntimeError, match="finished"):
        resumption.upstream_request()
    with pytest.raises(RuntimeError, match="no upstream attempt"):
        resumption.feed(b"{}")


# --- client events -----------------------------------------------------------------------------


def completion_chunk(text: str, ids: list[int] | None, **choice: Any) -> bytes:
    base = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    base |= {"stop_reason": None, "prompt_token_ids": None, "token_ids": ids}
    event = {"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "m"}
    return json.dumps({**event, "choices": [base | choice]}).encode()


def compact(payload: bytes) -> bytes:
    """An event as vLLM writes it: compact JSON (non-ASCII escaped, as json.dumps does)."""
    return json.dumps(json.loads(payload), separators=(",", ":")).encode()


def test_a_token_chunk_reaches_the_client_as_the_engine_encoded_its_text() -> None:
    # A plain token chunk of vLLM's compact shape is not decoded and encoded again: its text
    # goes as the engine escaped it, with the client's identity and token ids put in.
    for asked in (False, True):
        resumption = Resumption(COMPLETIONS_PATH, completions(stream=True, return_token_ids=asked))
        resumption.upstream_request()
        resumption.feed(compact(completion_chunk("a", [5], prompt_token_ids=[1, 2])))
        resumption.pause()
        resumption.upstream_request()
        resumption.feed(compact(completion_chunk("b", [6])))
        wire = b"".join(resumption.feed(compact(completion_chunk('\u00e9"', [7, 8]))))
        assert b'"text":"\\u00e9\\""' in wire
        [chunk] = parse_client(wire)
        assert (chunk["id"], chunk["created"]) == ("cmpl-9", 9)
        assert chunk["choices"] == [
            {
                "index": 0,
                "text": '\u00e9"',
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": [7, 8] if asked else None,
            }
        ]
        assert resumption.generated_tokens == 4


@pytest.mark.parametrize("asked_ids", [False, True])
def test_reads_of_one_token_chunk_take_the_byte_path_and_give_the_same_stream(
    asked_ids: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The relay's byte-level path (a read that is one whole token chunk) must give the client
    # exactly what the decoder's path gives the same events split anywhere, across pauses.
    body = completions(stream=True, max_tokens=12, return_token_ids=asked_ids)
    taken = Resumption._take_token_chunk
    whole_reads: list[bool] = []

    def spy(self: Resumption, data: bytes, text_at: int, *, whole_read: bool) -> bytes | None:
        out = taken(self, data, text_at, whole_read=whole_read)
        if out is not None:
            whole_reads.append(whole_read)
        return out

    monkeypatch.setattr(Resumption, "_take_token_chunk", spy)
    _, aligned = run(FakeVllm(compact=True), COMPLETIONS_PATH, body, [4, 3], aligned=True)
    assert whole_reads and all(whole_reads)
    whole_reads.clear()
    _, split = run(FakeVllm(compact=True), COMPLETIONS_PATH, body, [4, 3], random.Random(3))
    assert not any(whole_reads)
    assert aligned == split


def usage_chunk(prompt: int, completion: int, cached: int | None = None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    usage["total_tokens"] = prompt + completion
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return json.dumps({"id": "x", "choices": [], "usage": usage}).encode()


def test_token_ids_are_null_unless_asked_and_the_prompt_ids_show_once() -> None:
    for asked in (False, True):
        resumption = Resumption(COMPLETIONS_PATH, completions(stream=True, return_token_ids=asked))
        resumption.upstream_request()
        first = resumption.feed(completion_chunk("a", [5], prompt_token_ids=[1, 2]))
        resumption.pause()
        resumption.upstream_request()
        second = resumption.feed(completion_chunk("b", [6], prompt_token_ids=[1, 2, 5]))
        chunks = [parse_client(b"".join(first))[0], parse_client(b"".join(second))[0]]
        choices = [chunk["choices"][0] for chunk in chunks]
        assert [c["token_ids"] for c in choices] == ([[5], [6]] if asked else [None, None])
        assert [c["prompt_token_ids"] for c in choices] == (
            [[1, 2], None] if asked else [None, None]
        )
        assert [chunk["id"] for chunk in chunks] == ["cmpl-9", "cmpl-9"]


def test_an_upstream_error_passes_through_and_ends_the_answer() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(stream=True))
    resumption.upstream_request()
    error = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
    assert parse_client(b"".join(resumption.feed(json.dumps(error).encode()))) == [error]
    assert resumption.finished and resumption.error == error
    assert resumption.feed(b"[DONE]") == []
    assert resumption.final_events() == [b"data: [DONE]\n\n"]
    with pytest.raises(RuntimeError, match="error"):
        resumption.response()


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"[1]", id="not-an-object"),
        pytest.param(b'{"choices": 3}', id="choices-not-a-list"),
        pytest.param(b'{"choices": [{}, {}]}', id="two-choices"),
        pytest.param(b'{"choices": [{"text": "a", "token_ids": ["x"]}]}', id="bad-ids"),
    ],
)
def test_an_event_that_is_not_vllms_json_is_a_protocol_error(payload: bytes) -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions())
    resumption.upstream_request()
    with pytest.raises(UpstreamProtocolError):
        resumption.feed(payload)


def test_usage_totals_are_the_original_prompt_and_all_output() -> None:
    resumption = Resumption(
        COMPLETIONS_PATH,
        completions(prompt=[1, 2, 3], stream=True, stream_options={"include_usage": True}),
    )
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5]))
    resumption.pause()
    resumption.upstream_request()
    resumption.feed(completion_chunk("b", [6], finish_reason="length"))
    resumption.feed(usage_chunk(prompt=4, completion=1))
    resumption.feed(b"[DONE]")
    events = parse_client(b"".join(resumption.final_events()))
    assert events[-1] == "[DONE]"
    assert events[0]["choices"] == []
    assert events[0]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert resumption.prompt_tokens == 3 and resumption.generated_tokens == 2


def test_no_usage_chunk_unless_the_client_asked() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(stream=True))
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5], prompt_token_ids=[1], finish_reason="stop"))
    assert resumption.feed(usage_chunk(prompt=1, completion=1)) == []
    assert resumption.final_events() == [b"data: [DONE]\n\n"]


def test_cached_tokens_pass_through_and_are_capped_at_the_prompt_after_a_continuation() -> None:
    body = completions(prompt=[1, 2, 3], max_tokens=4)
    single = Resumption(COMPLETIONS_PATH, body)
    single.upstream_request()
    single.feed(completion_chunk("a", [5], finish_reason="stop"))
    single.feed(usage_chunk(prompt=3, completion=1, cached=2))
    assert single.response()["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}

    resumed = Resumption(COMPLETIONS_PATH, body)
    resumed.upstream_request()
    resumed.feed(completion_chunk("a", [5]))
    resumed.pause()
    resumed.upstream_request()
    resumed.feed(completion_chunk("b", [6], finish_reason="stop"))
    resumed.feed(usage_chunk(prompt=4, completion=1, cached=4))
    usage = resumed.response()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 3}
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (3, 2)


def test_recomputed_prompt_tokens_are_the_uncached_prompt_of_each_later_attempt() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(prompt=[1, 2, 3, 4], max_tokens=9))
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5]))
    resumption.pause()
    assert resumption.recomputed_prompt_tokens == 0  # the first prefill is no waste
    resumption.upstream_request()  # prompt of 5 tokens
    resumption.feed(completion_chunk("b", [6]))
    resumption.pause()  # cut before its usage: how much the cache held is unknown
    assert resumption.recomputed_prompt_tokens == 0
    resumption.upstream_request()  # prompt of 6 tokens
    resumption.pause()  # cut before any output: its prefill may not have run
    assert resumption.recomputed_prompt_tokens == 0
    resumption.upstream_request()
    resumption.feed(completion_chunk("c", [7], finish_reason="stop"))
    resumption.feed(usage_chunk(prompt=6, completion=1, cached=4))
    assert resumption.recomputed_prompt_tokens == 2
    resumption.attempt_ended()
    assert resumption.recomputed_prompt_tokens == 2  # counted once
    assert resumption.discarded_output_tokens == 0
    assert resumption.pauses == 3 and resumption.attempts == 4


def test_without_cached_tokens_a_continuations_whole_prompt_is_recomputed() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(prompt=[1, 2], max_tokens=9))
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5]))
    resumption.pause()
    resumption.upstream_request()
    resumption.feed(completion_chunk("b", [6], finish_reason="stop"))
    resumption.feed(usage_chunk(prompt=3, completion=1))
    assert resumption.recomputed_prompt_tokens == 3


def test_output_without_token_ids_restarts_a_non_streamed_request_and_counts_the_discard() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(max_tokens=4))
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5], prompt_token_ids=[1]))
    resumption.feed(completion_chunk("b", None))
    assert not resumption.pausable()
    resumption.attempt_ended()
    path, body = upstream(resumption)
    assert (path, body["prompt"]) == (COMPLETIONS_PATH, "hello")
    assert resumption.discarded_output_tokens == 1
    resumption.feed(completion_chunk("z", [9], finish_reason="stop"))
    assert resumption.response()["choices"][0]["text"] == "z"


def test_a_streaming_client_that_saw_output_that_cannot_continue_cannot_resume() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(stream=True))
    resumption.upstream_request()
    assert resumption.feed(completion_chunk("a", None))
    assert not resumption.pausable()
    with pytest.raises(RuntimeError, match="lose output"):
        resumption.pause()
    resumption.attempt_ended()
    assert not resumption.can_go_on()
    with pytest.raises(CannotResume):
        resumption.upstream_request()


@pytest.mark.parametrize(
    ("streams", "chunks", "expected"),
    [
        pytest.param(True, [], True, id="nothing-yet"),
        pytest.param(True, [("a", [5]), ("b", [6])], True, id="continuable"),
        pytest.param(False, [("a", [5]), ("b", None)], True, id="restart-unseen"),
        pytest.param(True, [("a", [5]), ("b", None)], False, id="restart-seen"),
    ],
)
def test_whether_an_answer_cut_between_attempts_can_go_on(
    streams: bool, chunks: list[tuple[str, list[int] | None]], expected: bool
) -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(stream=streams, max_tokens=8))
    resumption.upstream_request()
    assert not resumption.can_go_on(), "not while an attempt is in flight"
    for index, (text, ids) in enumerate(chunks):
        extra = {"prompt_token_ids": [1, 2]} if index == 0 else {}
        resumption.feed(completion_chunk(text, ids, **extra))
    resumption.attempt_ended()
    assert resumption.can_go_on() is expected
    if expected:
        resumption.upstream_request()  # what can_go_on promised
    else:
        with pytest.raises(CannotResume):
            resumption.upstream_request()


def test_a_finished_answer_does_not_go_on() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(max_tokens=1))
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5], prompt_token_ids=[1], finish_reason="length"))
    resumption.attempt_ended()
    assert resumption.finished and not resumption.can_go_on()


@pytest.mark.parametrize(
    "delta",
    [
        pytest.param({"reasoning": "hm"}, id="reasoning"),
        pytest.param({"reasoning_content": "hm"}, id="reasoning-content"),
        pytest.param({"tool_calls": [{"index": 0}]}, id="tool-calls"),
        pytest.param({}, id="text-held-back-by-a-parser"),
    ],
)
def test_a_chat_whose_output_the_engine_parses_is_not_pausable(delta: dict[str, Any]) -> None:
    resumption = Resumption(CHAT_PATH, chat(stream=True))
    resumption.upstream_request()
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    resumption.feed(json.dumps({**role, "prompt_token_ids": [1, 2]}).encode())
    assert resumption.pausable()  # nothing generated yet: a restart loses nothing
    plain = {"choices": [{"index": 0, "delta": {"content": ""}, "token_ids": [3]}]}
    resumption.feed(json.dumps(plain).encode())
    assert resumption.pausable()
    parsed = {"choices": [{"index": 0, "delta": delta, "token_ids": [4]}]}
    resumption.feed(json.dumps(parsed).encode())
    assert not resumption.pausable()


def test_every_token_asked_but_no_finish_chunk_finishes_by_length() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(prompt=[1], max_tokens=2, stream=True))
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5]))
    resumption.feed(completion_chunk("b", [6]))
    resumption.attempt_ended()
    assert resumption.finished and resumption.finish_reason == "length"
    events = parse_client(b"".join(resumption.final_events()))
    assert events[0]["choices"][0]["finish_reason"] == "length"
    assert events[0]["choices"][0]["text"] == ""
    assert events[-1] == "[DONE]"


def test_continuous_usage_carries_true_running_totals() -> None:
    body = completions(
        prompt=[1, 2],
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    engine = FakeVllm()
    resumption, stream = run(engine, COMPLETIONS_PATH, body, cuts=[2, 1])
    assert resumption.pauses == 2
    chunks = [event for event in parse_client(stream) if event != "[DONE]" and event["choices"]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == list(range(1, len(chunks) + 1))
    assert all(c["usage"]["prompt_tokens"] == 2 for c in chunks)


# --- the property: a paused answer equals one never paused -----------------------------------


def normalized(events: list[Any], first: Mapping[str, Any]) -> list[Any]:
    return [
        event if event == "[DONE]" else {**event, "id": first["id"], "created": first["created"]}
        for event in events
    ]


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from([COMPLETIONS_PATH, CHAT_PATH]))
    body: dict[str, Any] = {"model": "m"}
    if path == COMPLETIONS_PATH:
        body["prompt"] = draw(
            st.one_of(
                st.text("abcdefgh", min_size=1, max_size=8),
                st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=8),
            )
        )
    else:
        content = draw(st.text("abcdefgh", min_size=0, max_size=8))
        body["messages"] = [{"role": "user", "content": content}]
    bound = (
        "max_tokens"
        if path == COMPLETIONS_PATH
        else draw(st.sampled_from(["max_tokens", "max_completion_tokens"]))
    )
    body[bound] = draw(st.integers(1, 30))
    if draw(st.booleans()):
        body["min_tokens"] = draw(st.integers(0, 12))
    if draw(st.booleans()):
        body["ignore_eos"] = True
    if draw(st.booleans()):
        body["stop_token_ids"] = draw(st.lists(st.integers(1, VOCAB - 1), max_size=3))
    if draw(st.booleans()):
        body["return_token_ids"] = True
    if draw(st.booleans()):
        body["stream"] = True
        if draw(st.booleans()):
            continuous = draw(st.booleans())
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": continuous}
    return path, body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests(),
    st.lists(st.integers(0, 14), min_size=1, max_size=5),
    st.randoms(use_true_random=False),
    st.booleans(),
    st.booleans(),
)
def test_a_paused_answer_equals_one_never_paused(
    request: tuple[str, dict[str, Any]],
    cuts: list[int],
    rng: random.Random,
    compact: bool,
    aligned: bool,
) -> None:
    path, body = request
    resumption, stream = run(FakeVllm(compact=compact), path, body, cuts, rng, aligned=aligned)
    reference = FakeVllm()
    truth = FakeVllm().complete(path, {**body, "stream": False, "stream_options": None})
    assert resumption.generated_tokens == truth["usage"]["completion_tokens"]
    assert resumption.prompt_tokens == truth["usage"]["prompt_tokens"]
    if not body.get("stream"):
        assert stream == b""
        answer = resumption.response()
        expected = reference.complete(path, body)
        assert answer == {**expected, "id": answer["id"], "created": answer["created"]}
        # The first attempt that answered named it (the fake numbers its calls from 1).
        prefix, call = answer["id"].rsplit("-", 1)
        assert (prefix, answer["created"]) == (expected["id"].rsplit("-", 1)[0], 1000 + int(call))
    else:
        events = parse_client(stream)
        expected_events = [
            json.loads(p) if not is_done(p) else "[DONE]" for p in reference.stream(path, body)
        ]
        first = events[0]
        # One stream: the identity of the first chunk throughout, [DONE] once, at the end.
        assert all(
            (e["id"], e["created"], e["model"]) == (first["id"], first["created"], "m")
            for e in events
            if e != "[DONE]"
        )
        assert events.count("[DONE]") == 1
        assert events == normalized(expected_events, first)
    assert resumption.discarded_output_tokens == 0


def test_prompt_ids_missed_by_the_original_show_once_as_the_originals() -> None:
    # vLLM drops prompt_token_ids when the first output is an empty (chunked-prefill) chunk;
    # a token-id prompt is known from the body, and a continuation's own prompt is never shown.
    resumption = Resumption(
        COMPLETIONS_PATH, completions(prompt=[1, 2], stream=True, return_token_ids=True)
    )
    resumption.upstream_request()
    first = parse_client(b"".join(resumption.feed(completion_chunk("a", [5]))))
    resumption.pause()
    resumption.upstream_request()
    later = [
        parse_client(b"".join(resumption.feed(completion_chunk(text, [token], **extra))))[0]
        for text, token, extra in [("b", 6, {"prompt_token_ids": [1, 2, 5]}), ("c", 7, {})]
    ]
    shown = [chunk["choices"][0]["prompt_token_ids"] for chunk in [*first, *later]]
    assert shown == [None, [1, 2], None]


def test_a_text_prompt_whose_stream_drops_its_ids_continues_from_the_tokenized_ones() -> None:
    # vLLM 0.32 drops prompt_token_ids after an empty first chunk: output cannot be paused
    # without loss until /tokenize's ids come (preemptible.py asks beside the first attempt).
    resumption = Resumption(COMPLETIONS_PATH, completions(prompt="Hi", max_tokens=5))
    resumption.upstream_request()
    resumption.feed(completion_chunk("a", [5]))
    assert not resumption.pausable()
    resumption.take_prompt_ids([1, 2])
    assert resumption.pausable() and resumption.prompt_tokens == 2
    resumption.pause()
    path, continuation = upstream(resumption)
    assert (path, continuation["prompt"], continuation["max_tokens"]) == (
        COMPLETIONS_PATH,
        [1, 2, 5],
        4,
    )


def test_the_streams_own_prompt_ids_replace_tokenized_ones_and_others_are_kept() -> None:
    resumption = Resumption(COMPLETIONS_PATH, completions(prompt="Hi", max_tokens=5))
    resumption.upstream_request()
    resumption.take_prompt_ids([9])
    resumption.feed(completion_chunk("a", [5], prompt_token_ids=[1, 2]))
    resumption.take_prompt_ids([7, 7, 7])  # the engine's own ids are known: kept
    resumption.pause()
    assert upstream(resumption)[1]["prompt"] == [1, 2, 5]
    # A prompt of ids is its own: /tokenize's never replace it.
    ids_prompt = Resumption(COMPLETIONS_PATH, completions(prompt=[3, 4], max_tokens=5))
    ids_prompt.upstream_request()
    ids_prompt.take_prompt_ids([8])
    ids_prompt.feed(completion_chunk("a", [5]))
    ids_prompt.pause()
    assert upstream(ids_prompt)[1]["prompt"] == [3, 4, 5]
