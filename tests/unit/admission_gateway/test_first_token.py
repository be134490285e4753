"""Time to first token starts at the first event that carries generated content."""

from __future__ import annotations

import json
from typing import Any

import pytest

from admission_gateway.first_token import FirstTokenDetector


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


ROLE_ONLY = event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
CHAT_TOKEN = event({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
COMPLETION_TOKEN = event({"choices": [{"index": 0, "text": "Hi"}]})


@pytest.mark.parametrize(
    ("chunks", "found_at"),
    [
        pytest.param([ROLE_ONLY, CHAT_TOKEN], 1, id="chat-role-event-is-no-token"),
        pytest.param([COMPLETION_TOKEN], 0, id="completion-text"),
        pytest.param([CHAT_TOKEN[:9], CHAT_TOKEN[9:]], 1, id="event-split-across-chunks"),
        pytest.param([b": keep-alive\n\n", b"data: [DONE]\n\n"], None, id="no-content"),
        pytest.param([b"data: {not json\n\n", COMPLETION_TOKEN], 1, id="garbage-then-token"),
        pytest.param([(ROLE_ONLY + CHAT_TOKEN).replace(b"\n", b"\r\n")], 0, id="crlf"),
    ],
)
def test_detects_the_first_content_event(chunks: list[bytes], found_at: int | None) -> None:
    detector = FirstTokenDetector()
    results = [detector.feed(chunk) for chunk in chunks]
    expected = [found_at is not None and index >= found_at for index in range(len(chunks))]
    assert results == expected


def test_an_endless_line_does_not_grow_the_buffer_without_bound() -> None:
    detector = FirstTokenDetector(max_line_bytes=16)
    assert not detector.feed(b"data: " + b"x" * 100)
    assert detector.feed(COMPLETION_TOKEN)
