"""Spotting the first generated token in an OpenAI-style server-sent event stream.

Time to first token is measured at the first event that carries generated content: vLLM's
chat streams open with an event that carries only the assistant role, which is no token yet.
`FirstTokenDetector` stops reading once it has seen it, so the rest of the stream costs nothing
(the token counts come from admission_gateway/token_usage.py, which parses no event but the
usage).
"""

from __future__ import annotations

from typing import Any

import orjson


class FirstTokenDetector:
    """Fed the stream's bytes as they pass, it says when the first content event has gone by.

    Once it has, it stops looking, so the rest of the stream costs nothing.
    """

    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        self._buffer = bytearray()
        self._max_line_bytes = max_line_bytes
        self.found = False
        """Whether an event with generated content has been seen."""

    def feed(self, chunk: bytes) -> bool:
        """Consume the next bytes; True once the first content event is complete."""
        if self.found:
            return True
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            if line.startswith(b"data:") and _carries_content(line[5:].strip()):
                self.found = True
                self._buffer.clear()
                return True
        if len(self._buffer) > self._max_line_bytes:
            # No sane event is this long; stop holding memory for it.
            self._buffer.clear()
        return False


def event_object(data: bytes) -> dict[str, Any] | None:
    """An SSE data payload as a JSON object; None for [DONE] and anything not an object."""
    if not data or data == b"[DONE]":
        return None
    try:
        event: Any = orjson.loads(data)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _carries_content(data: bytes) -> bool:
    event = event_object(data)
    return event is not None and _has_content(event)


def _has_content(event: dict[str, Any]) -> bool:
    choices = event.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        ):
            return True
    return False
