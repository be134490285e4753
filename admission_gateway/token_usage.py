"""Counting every tenant's tokens from the engine's own `usage`, at a forwarding proxy's cost.

A non-streamed answer carries `usage` (prompt and completion tokens); the gateway reads it from
the body it has read anyway. A stream carries it only when the request asks for
`stream_options.include_usage`: then the engine sends one more event before `[DONE]`, whose
`choices` is `[]` and whose `usage` has the request's totals. So the gateway asks for it
(`ask_for_usage`) and, for a client who did not, takes that event out of the stream on its way
(`UsageScanner`): the client sees exactly the stream it asked for.

The scanner does no per-event parsing. It keeps the relayed bytes aligned on event boundaries
(an event split across reads is held until its blank line arrives, which costs nothing in latency:
an SSE client cannot use half an event), counts the reads it relays (each holds at least one
whole event), and parses only the one event whose `"usage":` holds an object, found with one
C-level search per read (OpenAI's API, and servers that copy it, put `"usage":null` on every
chunk of a stream that asked for usage; vLLM leaves the key out). That key cannot
appear inside generated text: a quote in a JSON string is escaped, so `"usage":` occurs only as
an object's key.

A stream cut before its usage event (the client went away, the engine failed) counts what the
engine delivered to the gateway: the reads of content it relayed, each at least one event of at
least one token. What is missed is at most the tokens of the engine step in progress when the
stream was cut, plus, where one read held several events (a gateway that lags behind its engine)
or one event several tokens (vLLM merges steps for a reader that lags, and with speculative
decoding), the extra ones: the count is a lower bound. A non-streamed request
cancelled before its answer came counts nothing: the engine delivered nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import orjson

from admission_gateway.first_token import event_object

_USAGE_KEY = b'"usage":'
_NO_USAGE = b"null"
_MAX_PENDING_BYTES = 1 << 20
"""An event longer than this is relayed as it comes, unaligned (no sane event is this long)."""


@dataclass(slots=True)
class TokenTotals:
    """One tenant's tokens for one model at this gateway, since it started."""

    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0


def ask_for_usage(document: Mapping[str, Any], body: bytes) -> bytes | None:
    """The body to send instead of `body` (the request `document`, parsed) so that a stream
    ends with the engine's usage event; None when `body` does already, or is no stream.

    The option is spliced in as bytes, not by re-encoding the document: the engine reads the
    client's JSON exactly as sent (numbers, escapes and key order untouched). A request that
    names `stream_options` without `include_usage` is re-encoded with it added."""
    if not document.get("stream"):
        return None
    options = document.get("stream_options")
    if options is None:
        start = body.find(b"{")
        if start < 0:
            return None
        inner = body[start + 1 :].lstrip()
        separator = b"" if inner.startswith(b"}") else b","
        return b'{"stream_options":{"include_usage":true}' + separator + inner
    if not isinstance(options, Mapping) or options.get("include_usage"):
        return None
    return orjson.dumps({**document, "stream_options": {**options, "include_usage": True}})


class UsageScanner:
    """Reads an SSE stream on its way to the client (see the module docstring): `feed` returns
    the bytes to relay now; `usage` is the engine's last usage once an event carried it."""

    __slots__ = ("_last", "_pending", "hide_usage", "reads", "usage")

    def __init__(self, *, hide_usage: bool = False) -> None:
        self.hide_usage = hide_usage
        """Take the usage-only event (`choices` `[]`) out: the client did not ask for it."""
        self._pending = b""
        self.reads = 0
        """Reads relayed so far, each of whole events (at least one; `[DONE]` included)."""
        self._last = b""
        self.usage: tuple[int, int] | None = None
        """(prompt, completion) tokens from the newest event that carried usage."""

    def feed(self, chunk: bytes) -> bytes:
        """The complete events `chunk` ends (with what an earlier read left of one), less a
        hidden usage event; what follows the last complete event waits for the next read."""
        if self._pending:
            chunk = self._pending + chunk
            self._pending = b""
        if not chunk.endswith((b"\n\n", b"\r\n\r\n")):
            end = _last_event_end(chunk)
            if end < len(chunk) and len(chunk) - end <= _MAX_PENDING_BYTES:
                self._pending = chunk[end:]
                chunk = chunk[:end]
        if not chunk:
            return b""
        # Per read, the least that can be done: one search in C and two stores. `rfind`, not
        # `in`: CPython's bytes `in` first tries its operand as an integer, and raises and
        # clears a TypeError with a formatted message on every call.
        self.reads += 1
        self._last = chunk
        at = chunk.rfind(_USAGE_KEY)
        # A `"usage":null` on every chunk (OpenAI's shape) would otherwise parse every event.
        if at >= 0 and not chunk.startswith(_NO_USAGE, at + len(_USAGE_KEY)):
            chunk = self._take_usage(chunk, at)
        return chunk

    def passed(self, read: bytes) -> bool:
        """A read goes to the client as it is (framed, ending an event): counted as a read
        when nothing of an earlier read waits to be joined to it and it names no usage; False,
        counting nothing, otherwise (`feed` it then)."""
        if self._pending or read.rfind(_USAGE_KEY) >= 0:
            return False
        self.reads += 1
        self._last = read
        return True

    @property
    def done(self) -> bool:
        """Whether the stream's last event so far is `[DONE]`."""
        return self._last.endswith((b"[DONE]\n\n", b"[DONE]\r\n\r\n"))

    def flush(self) -> bytes:
        """What is left at the stream's end: an event the engine never finished."""
        rest, self._pending = self._pending, b""
        return rest

    def _take_usage(self, chunk: bytes, at: int) -> bytes:
        start = _last_event_end(chunk, at)
        end = _event_end(chunk, at)
        event = _data_of(chunk[start:end])
        if event is None:
            return chunk
        usage = _usage_pair(event.get("usage"))
        if usage is not None:
            self.usage = usage
        if self.hide_usage and event.get("choices") == []:
            return chunk[:start] + chunk[end:]
        return chunk


def usage_of_answer(content: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from a whole (non-streamed) answer's `usage`."""
    if content.find(_USAGE_KEY) < 0:
        return None
    try:
        answer: Any = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return _usage_pair(answer.get("usage")) if isinstance(answer, dict) else None


def _usage_pair(usage: Any) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a `usage` object; None for anything else."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if _is_count(prompt) and _is_count(completion):
        return prompt, completion
    return None


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _last_event_end(data: bytes, before: int | None = None) -> int:
    """Just past the last event terminator (a blank line) in `data`, or in `data[:before]`; 0
    when there is none."""
    stop = len(data) if before is None else before
    lf = data.rfind(b"\n\n", 0, stop)
    crlf = data.rfind(b"\r\n\r\n", 0, stop)
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _event_end(data: bytes, at: int) -> int:
    """Just past the terminator of the event holding offset `at`; len(data) without one."""
    lf = data.find(b"\n\n", at)
    crlf = data.find(b"\r\n\r\n", at)
    ends = [end for end in (lf + 2 if lf >= 0 else -1, crlf + 4 if crlf >= 0 else -1) if end >= 0]
    return min(ends) if ends else len(data)


def _data_of(event: bytes) -> dict[str, Any] | None:
    """The JSON object of an event's `data:` lines; None for anything else."""
    return event_object(
        b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    )
