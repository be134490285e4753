"""Spotting the first generated token in an OpenAI-style server-sent event stream, and counting
the rest for the request log.

Time to first token is measured at the first event that carries generated content: vLLM's
chat streams open with an event that carries only the assistant role, which is no token yet.
`FirstTokenDetector` stops reading once it has seen it; `StreamTally`, used only when the
request log is on, reads every event (a JSON parse each) to count content events and keep the
usage the engine sent, if any.
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


class StreamTally:
    """Fed the stream's bytes as they pass: how many events carried generated content, and the
    last token counts the engine's `usage` gave (present when the client asked for
    `stream_options.include_usage`)."""

    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        self._buffer = bytearray()
        self._max_line_bytes = max_line_bytes
        self.content_events = 0
        """Events with generated content so far."""
        self.prompt_tokens: int | None = None
        """The usage's prompt tokens, once an event carried usage."""
        self.completion_tokens: int | None = None
        """The usage's completion tokens, once an event carried usage."""
        self.fed = False
        """Whether any of the stream went by (the engine answered with a stream)."""

    def feed(self, chunk: bytes) -> bool:
        """Consume the next bytes; True when they completed the stream's first content event."""
        first = False
        self.fed = True
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            if not line.startswith(b"data:"):
                continue
            event = _event(line[5:].strip())
            if event is None:
                continue
            if _has_content(event):
                self.content_events += 1
                first = first or self.content_events == 1
            usage = event.get("usage")
            if isinstance(usage, dict):
                prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
                if isinstance(prompt, int) and isinstance(completion, int):
                    self.prompt_tokens, self.completion_tokens = prompt, completion
        if len(self._buffer) > self._max_line_bytes:
            self._buffer.clear()
        return first


def _event(data: bytes) -> dict[str, Any] | None:
    """An SSE data payload as a JSON object; None for [DONE] and anything not an object."""
    if not data or data == b"[DONE]":
        return None
    try:
        event: Any = orjson.loads(data)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _carries_content(data: bytes) -> bool:
    event = _event(data)
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
