"""token_usage: the gateway asks for the engine's usage without changing what the engine reads,
relays the stream event-aligned and unchanged but for the usage event it asked for, and parses
only that event."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission_gateway.token_usage import UsageScanner, ask_for_usage, usage_of_answer


def _event(payload: dict[str, Any] | str, *, crlf: bool = False) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    end = b"\r\n\r\n" if crlf else b"\n\n"
    return b"data: " + data.encode() + end


def _chat_stream(tokens: list[str], *, usage: bool, crlf: bool = False) -> list[bytes]:
    """The events of a vLLM chat stream: the role, one per token, the usage if asked, [DONE]."""
    events = [_event({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, crlf=crlf)]
    events += [_event({"choices": [{"delta": {"content": t}}]}, crlf=crlf) for t in tokens]
    if usage:
        events.append(
            _event(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 7,
                        "completion_tokens": len(tokens),
                        "total_tokens": 7 + len(tokens),
                    },
                },
                crlf=crlf,
            )
        )
    events.append(_event("[DONE]", crlf=crlf))
    return events


def _relay(scanner: UsageScanner, chunks: list[bytes]) -> bytes:
    return b"".join(scanner.feed(c) for c in chunks) + scanner.flush()


# -- asking for usage --


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","stream":true,"prompt":"x"}',
        b'  {\n "stream": true, "prompt": "caf\\u00e9", "n": 1.50}',
        b'{"stream": true, "big": 123456789012345678901234567890}',
    ],
)
def test_the_option_is_spliced_in_and_the_rest_of_the_body_is_untouched(body: bytes) -> None:
    document = json.loads(body)
    sent = ask_for_usage(document, body)
    assert sent is not None
    assert json.loads(sent) == {**document, "stream_options": {"include_usage": True}}
    # What follows the opening brace reaches the engine byte for byte.
    assert sent.endswith(body[body.index(b"{") + 1 :].lstrip())


def test_an_option_set_without_usage_gets_it_and_keeps_the_others() -> None:
    document = {"stream": True, "stream_options": {"continuous_usage_stats": False}, "prompt": "x"}
    sent = ask_for_usage(document, json.dumps(document).encode())
    assert sent is not None
    assert orjson.loads(sent)["stream_options"] == {
        "continuous_usage_stats": False,
        "include_usage": True,
    }


@pytest.mark.parametrize(
    "document",
    [
        {"prompt": "x"},
        {"stream": False, "prompt": "x"},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "stream_options": "nonsense"},
    ],
)
def test_nothing_is_changed_when_there_is_no_stream_or_the_client_asked(
    document: dict[str, Any],
) -> None:
    assert ask_for_usage(document, json.dumps(document).encode()) is None


# -- the scanner --


def test_the_usage_event_it_asked_for_is_hidden_and_read() -> None:
    events = _chat_stream(["Hel", "lo"], usage=True)
    scanner = UsageScanner(hide_usage=True)
    relayed = _relay(scanner, events)
    assert relayed == b"".join(e for e in events if b'"usage"' not in e)
    assert scanner.usage == (7, 2)
    assert (scanner.reads, scanner.done) == (len(events), True)


def test_a_client_that_asked_gets_the_usage_event() -> None:
    events = _chat_stream(["a"], usage=True)
    scanner = UsageScanner(hide_usage=False)
    assert _relay(scanner, events) == b"".join(events)
    assert scanner.usage == (7, 1)


def test_continuous_usage_counts_the_newest_and_hides_nothing_with_choices() -> None:
    events = [
        _event({"choices": [{"text": "a"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
        _event({"choices": [{"text": "b"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
    ]
    scanner = UsageScanner(hide_usage=True)
    assert _relay(scanner, [b"".join(events)]) == b"".join(events)
    assert scanner.usage == (3, 2)


def test_a_null_usage_on_every_chunk_is_passed_over_and_the_last_event_counts() -> None:
    # OpenAI's shape: every chunk of a stream that asked for usage says `"usage":null`, the usage
    # event at the end has the totals; `null` must neither be parsed as usage nor hide an event.
    events = [_event({"choices": [{"text": t}], "usage": None}) for t in ("a", "b")]
    events.append(_event({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}))
    events.append(_event("[DONE]"))
    scanner = UsageScanner(hide_usage=True)
    assert _relay(scanner, events) == b"".join(events[:2] + events[3:])
    assert scanner.usage == (4, 2)
    spaced = UsageScanner(hide_usage=True)
    assert _relay(spaced, [e.replace(b'"usage":null', b'"usage": null') for e in events[:2]])
    assert spaced.usage is None


def test_generated_text_that_spells_the_key_is_not_usage() -> None:
    text = 'he said "usage": {"prompt_tokens": 1, "completion_tokens": 1}'
    events = _chat_stream([text], usage=False)
    scanner = UsageScanner(hide_usage=True)
    assert _relay(scanner, events) == b"".join(events)
    assert scanner.usage is None


def test_crlf_streams_are_aligned_and_hidden_as_well() -> None:
    events = _chat_stream(["x", "y"], usage=True, crlf=True)
    whole = b"".join(events)
    scanner = UsageScanner(hide_usage=True)
    relayed = _relay(scanner, [whole[:9], whole[9:40], whole[40:]])
    assert relayed == b"".join(e for e in events if b'"usage"' not in e)
    assert scanner.usage == (7, 2)


def test_a_chunk_without_an_event_end_waits_and_an_unfinished_one_is_flushed() -> None:
    scanner = UsageScanner()
    assert scanner.feed(b'data: {"choices"') == b""
    assert (
        scanner.feed(b':[{"text":"a"}]}\n\ndata: {"cho') == b'data: {"choices":[{"text":"a"}]}\n\n'
    )
    assert scanner.flush() == b'data: {"cho'
    assert scanner.reads == 1


def test_an_event_longer_than_any_sane_one_is_relayed_unaligned() -> None:
    scanner = UsageScanner()
    huge = b"data: " + b"x" * (2 << 20)
    assert scanner.feed(huge) == huge


@given(
    tokens=st.lists(st.text(min_size=1, max_size=6), max_size=12),
    usage=st.booleans(),
    hide=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
)
def test_any_split_of_the_stream_relays_the_same_events(
    tokens: list[str], usage: bool, hide: bool, cuts: list[int]
) -> None:
    """Contract: whatever the reads' boundaries, the client gets the engine's bytes, whole events
    at a time, less the usage event when it is hidden; the usage and the event count are the
    stream's."""
    events = _chat_stream(tokens, usage=usage)
    whole = b"".join(events)
    points = sorted({min(c, len(whole)) for c in cuts} | {0, len(whole)})
    chunks = [whole[a:b] for a, b in itertools.pairwise(points)]
    scanner = UsageScanner(hide_usage=hide)
    pieces = [scanner.feed(c) for c in chunks]
    assert all(p.endswith(b"\n\n") for p in pieces if p)
    relayed = b"".join(pieces) + scanner.flush()
    expected = [e for e in events if not (hide and b'"choices":[]' in e)]
    assert relayed == b"".join(expected)
    # Each relayed read holds whole events: the reads are a lower bound on the events.
    assert sum(1 for p in pieces if p) <= scanner.reads <= len(events)
    assert scanner.usage == ((7, len(tokens)) if usage else None)


# -- a whole answer --


def test_a_whole_answer_gives_its_usage() -> None:
    answer = {"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    assert usage_of_answer(json.dumps(answer).encode()) == (4, 2)


@pytest.mark.parametrize(
    "content",
    [
        b'{"choices": []}',
        b"not json",
        b'["usage":1]',
        b'{"usage": {"prompt_tokens": -1, "completion_tokens": 2}}',
        b'{"usage": {"prompt_tokens": true, "completion_tokens": 2}}',
    ],
)
def test_an_answer_without_sane_usage_gives_none(content: bytes) -> None:
    assert usage_of_answer(content) is None
