"""The request log: one JSON line per finished request, written by the gateways, read back merged.

What a line holds (`RequestRecord`) is what a replay of the traffic needs and the gateway knows
without reading content: when the request arrived (wall clock), whose it was, a keyed hash of
its session, its shape (route, streamed or not, max_tokens asked, prompt and output token
counts) and how it ended (outcome, status, latencies). Never a prompt, an output, an API key or
the raw session id: the record type has no field that could carry them.

- `SessionHasher`: the session id, HMAC-SHA-256 under a key from the config (a secret file), so
  that the same session is recognisable across lines and gateways but cannot be read back or
  guessed by hashing candidate names without the key.
- `RequestLogWriter`: the gateway's writer. `write` only serialises and appends to a memory
  buffer (it never waits on disk); a supervised task (`run`) hands the buffer to a thread of
  its own every flush interval, which appends the lines and rotates the file by size
  (`log.jsonl` -> `log.jsonl.1` -> ... `log.jsonl.N`). A full buffer drops records (counted)
  rather than hold the data path.
- `read_log`, `merge_logs`: read and validate one file's lines; merge several files (gateways,
  rotated parts) by arrival time, streaming (see `merge_logs` for the one bound it assumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import hmac
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, BinaryIO, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 1
"""The `v` of every line this module writes; a reader refuses other versions."""

SESSION_HEADER = "X-Session-Id"
"""The header a client may send to name its session (it wins over the body's `user`)."""

_SESSION_DIGEST_HEX_CHARS = 32
"""128 bits of the HMAC: collisions are out of reach for any log's number of sessions."""

TokenSource = Literal["usage", "stream_events", "token_ids"]
"""Where a record's output token count comes from (`RequestRecord.output_tokens_from`)."""

NonNegativeMs = Annotated[float, Field(ge=0)]
TokenCount = Annotated[int, Field(ge=0)]


class Outcome(StrEnum):
    """How a request ended, as the gateway knows it."""

    COMPLETED = "completed"
    """The whole answer went out (a 2xx status, the stream to its end)."""
    REJECTED = "rejected"
    """Turned away before admission (`reason`: queue_full, queue_timeout, shutting_down)."""
    TIMED_OUT = "timed_out"
    """The engine did not finish within the gateway's upstream timeout (504, or a stream
    ended by a timeout error event)."""
    CANCELLED = "cancelled"
    """The client went away before the end (queued, running or streaming)."""
    UPSTREAM_ERROR = "upstream_error"
    """The engine failed it: unreachable (502), an error status of its own, or an error event
    that ended a stream under way."""
    INVALID = "invalid"
    """The gateway refused the body itself (not JSON, too large): never admissible."""
    GATEWAY_ERROR = "gateway_error"
    """The gateway failed (500): a bug."""


class RequestRecord(BaseModel):
    """One finished request: a line of the log. Frozen, unknown fields refused (a line with a
    field this version does not know is bad, not silently cut)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    v: Literal[1] = SCHEMA_VERSION
    """The line's schema version."""

    arrival_unix_s: float
    """When the request arrived at the gateway: seconds since the Unix epoch on the gateway's
    wall clock (the merge key across gateways, so their clocks should be NTP-synchronised)."""

    gateway: str
    """The gateway's id (as it names itself towards the control plane)."""

    pool: str
    """The pool the gateway serves."""

    tenant: str
    """The tenant its API key belongs to (never the key)."""

    session: str | None = None
    """HMAC-SHA-256 (first 128 bits, hex) under the configured session key of the tenant's name
    and the client's session id: the `X-Session-Id` header when sent, else the body's OpenAI
    `user` field. None when the client named neither or no key is configured."""

    route: str
    """The API route (`/v1/completions` or `/v1/chat/completions`)."""

    streamed: bool | None = None
    """Whether the client asked for a stream; None when the body could not be read."""

    max_tokens: TokenCount | None = None
    """The output bound the client asked for (`max_tokens`, or chat's `max_completion_tokens`);
    None when it set none."""

    prompt_tokens: TokenCount | None = None
    """Prompt length in tokens, from the engine's `usage` (a non-streamed answer has it, a stream
    only when the client asked for `stream_options.include_usage`; a preemptible tenant's
    resumable request from its token ids). None when the engine never said: not a guess."""

    output_tokens: TokenCount | None = None
    """Tokens generated, from the engine's `usage` when it sent one; for a stream without usage,
    the number of content events the gateway relayed (one per token for vLLM without
    speculative decoding, which may pack several into one event: then a lower bound), see
    `output_tokens_from`. None when the request reached no engine."""

    output_tokens_from: TokenSource | None = None
    """Where `output_tokens` comes from: the engine's `usage`, counting streamed content events,
    or the token ids the engine returned (a preemptible tenant's resumable request)."""

    outcome: Outcome
    """How it ended."""

    reason: str | None = None
    """The error code of a request that did not complete (`queue_full`, `upstream_timeout`,
    `client_disconnected`, `engine_error`, ...); None for a completed one."""

    status: int | None = None
    """The HTTP status the client got (200 for a stream, even one that an error event ended
    later); None when the client went away before any status."""

    pauses: TokenCount = 0
    """Times the request was paused so that a lender got its slots back (preemptible tenants'
    resumable requests; docs/preemption.md) and resumed later."""

    queue_wait_ms: NonNegativeMs | None = None
    """Time it waited for a slot (its first one); None when never admitted."""

    ttft_ms: NonNegativeMs | None = None
    """Arrival to the first streamed content event; None for an answer not streamed or one that
    streamed no content."""

    e2e_ms: NonNegativeMs
    """Arrival to the request's end, whatever the outcome (a rejection's end is its refusal)."""

    @property
    def ended_unix_s(self) -> float:
        """When it ended on the gateway's wall clock: arrival plus e2e."""
        return self.arrival_unix_s + self.e2e_ms / 1000.0


class SessionHasher:
    """Hashes clients' session ids under a secret key (see `RequestRecord.session`)."""

    def __init__(self, key: bytes) -> None:
        """`key`: the secret, at least 16 bytes (a short key would make dictionary attacks on
        the hashes cheap)."""
        if len(key) < 16:
            raise ValueError(f"the session key has {len(key)} bytes; at least 16 are needed")
        self._key = key

    def session(self, tenant: str, session_id: str) -> str:
        """The hash of `session_id` of `tenant`: the same pair always gives the same hash, and
        the same id of two tenants two different hashes."""
        message = tenant.encode() + b"\0" + session_id.encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:_SESSION_DIGEST_HEX_CHARS]


def session_key_from_text(text: str) -> bytes:
    """The session key held by a secret file's text: its first line, stripped (as the admin
    token file is read). ValueError when that is empty or shorter than 16 bytes."""
    lines = text.splitlines()
    key = lines[0].strip().encode() if lines else b""
    if len(key) < 16:
        raise ValueError(f"the session key has {len(key)} bytes; at least 16 are needed")
    return key


class RequestLogWriter:
    """Appends records to `path` as JSON lines, off the event loop (see the module docstring).

    Use from one event loop: `write` from the data path, `run` as one supervised task, `close`
    once at shutdown (after the last request has ended). Every file operation runs in one
    thread of the writer's own, in order, so a flush cancelled mid-way (the task stopped) still
    finishes before the next one starts, and lines never interleave.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_bytes_per_file: int,
        files_kept: int,
        flush_interval_s: float,
        max_buffered_records: int,
        flush_at_bytes: int = 1 << 18,
    ) -> None:
        """max_bytes_per_file: a file is rotated before a line would take it past this (a line
        is never split; a line longer than it gets a file to itself). files_kept: rotated
        files kept (`path.1` newest .. `path.N`), the current one not counted. flush_at_bytes:
        buffered bytes that wake the flush before its interval is over."""
        if max_bytes_per_file < 1 or files_kept < 1 or max_buffered_records < 1:
            raise ValueError("max_bytes_per_file, files_kept and max_buffered_records must be >= 1")
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be positive, not {flush_interval_s}")
        self.path = path
        """The file written now; rotated files are next to it."""
        self._max_bytes = max_bytes_per_file
        self._files_kept = files_kept
        self._flush_interval_s = flush_interval_s
        self._max_buffered = max_buffered_records
        self._flush_at_bytes = flush_at_bytes
        self._buffer: list[bytes] = []
        self._buffered_bytes = 0
        self._wake = asyncio.Event()
        self._closed = False
        self._file: BinaryIO | None = None
        self._size = 0
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-log")
        self.written_total = 0
        """Records written to a file so far."""
        self.dropped_total = 0
        """Records lost: the buffer was full, a write failed, or they came after close."""

    def write(self, record: RequestRecord) -> None:
        """Buffer one record; never blocks, never raises for the log's sake (a record that does
        not fit in the buffer, or comes after close, is dropped and counted)."""
        if self._closed or len(self._buffer) >= self._max_buffered:
            self.dropped_total += 1
            if self.dropped_total == 1 or self.dropped_total % 10_000 == 0:
                logger.warning(
                    "request log %s: %d records dropped (buffer full or log closed)",
                    self.path,
                    self.dropped_total,
                )
            return
        line = record.model_dump_json().encode() + b"\n"
        self._buffer.append(line)
        self._buffered_bytes += len(line)
        if self._buffered_bytes >= self._flush_at_bytes:
            self._wake.set()

    @property
    def buffered(self) -> int:
        """Records waiting for the next flush."""
        return len(self._buffer)

    async def open(self) -> None:
        """Open (create or append to) the file now, so that a path that cannot be written fails
        at start-up rather than at the first flush. Raises OSError."""
        await self._in_thread(self._open)

    async def run(self) -> None:
        """Flush every flush interval (sooner when the buffer grows past flush_at_bytes), until
        cancelled. A failed write is logged and its records counted as dropped; the loop goes
        on."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._flush_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write what is buffered now to the file (in the writer's thread) and wait for it."""
        if not self._buffer:
            return
        batch, self._buffer, self._buffered_bytes = self._buffer, [], 0
        try:
            await self._in_thread(self._append, batch)
        except OSError as exc:
            self.dropped_total += len(batch)
            logger.error("request log %s: %d records lost: %s", self.path, len(batch), exc)
        else:
            self.written_total += len(batch)

    async def close(self) -> None:
        """Flush what is left and close the file; later records are dropped. Safe to call
        twice."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        try:
            await self._in_thread(self._close)
        finally:
            self._io.shutdown(wait=False)

    async def _in_thread(self, function: Callable[..., None], *args: object) -> None:
        await asyncio.get_running_loop().run_in_executor(self._io, function, *args)

    # -- in the writer's thread --

    def _open(self) -> None:
        if self._file is None:
            self._file = self.path.open("ab")
            self._size = self._file.tell()

    def _append(self, lines: list[bytes]) -> None:
        self._open()
        assert self._file is not None
        pending: list[bytes] = []
        pending_bytes = 0
        for line in lines:
            if self._size + pending_bytes > 0 and (
                self._size + pending_bytes + len(line) > self._max_bytes
            ):
                self._file.write(b"".join(pending))
                pending, pending_bytes = [], 0
                self._rotate()
            pending.append(line)
            pending_bytes += len(line)
        self._file.write(b"".join(pending))
        self._size += pending_bytes
        self._file.flush()

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        for index in range(self._files_kept - 1, 0, -1):
            older = self._rotated(index)
            if older.exists():
                os.replace(older, self._rotated(index + 1))
        os.replace(self.path, self._rotated(1))
        self._file = self.path.open("ab")
        self._size = 0

    def _rotated(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line of a request log that is not a valid record."""

    path: str
    line: int
    """1-based."""
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"


class RequestLogError(ValueError):
    """A request log that cannot be read: a bad line (`bad`), or a file that cannot be opened."""

    def __init__(self, message: str, bad: BadLine | None = None) -> None:
        super().__init__(message)
        self.bad = bad


OnBadLine = Callable[[BadLine], None]
"""Told each bad line, which is then skipped; without one, the first bad line raises."""


def read_log(path: Path, *, on_bad_line: OnBadLine | None = None) -> Iterator[RequestRecord]:
    """The records of one log file in file order (the order the requests ended), read lazily and
    validated line by line. A bad line (not JSON, not a record of this schema version, a torn
    last line) raises RequestLogError naming the file and line, or goes to `on_bad_line` and is
    skipped. RequestLogError also when the file cannot be opened."""
    for _, record in _numbered(path, on_bad_line):
        yield record


def _numbered(path: Path, on_bad_line: OnBadLine | None) -> Iterator[tuple[int, RequestRecord]]:
    """`read_log`'s records with their line numbers."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise RequestLogError(f"{path}: cannot read: {exc}") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            try:
                record = RequestRecord.model_validate_json(line)
            except ValidationError as exc:
                problem = "; ".join(
                    f"{'.'.join(str(p) for p in error['loc']) or 'line'}: {error['msg']}"
                    for error in exc.errors(include_url=False)
                )
                _bad(BadLine(str(path), number, problem), on_bad_line)
                continue
            yield number, record


def merge_logs(
    paths: Iterable[Path],
    *,
    max_request_s: float = 3600.0,
    on_bad_line: OnBadLine | None = None,
) -> Iterator[RequestRecord]:
    """The records of every file in `paths` (several gateways' logs, rotated parts included),
    in order of arrival, ties in the order of `paths`: a streaming k-way merge that holds, per
    file, only the records of requests still possibly overtaken.

    A file is in the order its requests ended, not arrived; a request that arrived earlier may
    appear later, at most as much later as it lasted. `max_request_s` bounds that: a record is
    passed on once its file has reached requests that ended max_request_s after it arrived
    (memory: the requests that end within max_request_s). A record that arrived before one
    already passed on (it lasted longer than max_request_s, or the gateway's clock stepped
    back) is a bad line, as is every line `read_log` refuses."""
    if max_request_s < 0:
        raise ValueError(f"max_request_s must be >= 0, not {max_request_s}")
    streams = [_by_arrival(path, max_request_s, on_bad_line) for path in paths]
    yield from heapq.merge(*streams, key=lambda record: record.arrival_unix_s)


def _by_arrival(
    path: Path, max_request_s: float, on_bad_line: OnBadLine | None
) -> Iterator[RequestRecord]:
    """One file's records re-ordered by arrival, given that none lasted over max_request_s."""
    held: list[tuple[float, int, RequestRecord]] = []
    latest_end = float("-inf")
    passed = float("-inf")
    for number, record in _numbered(path, on_bad_line):
        arrival = record.arrival_unix_s
        if arrival < passed:
            problem = (
                f"arrived at {arrival:.3f}, before a record already merged ({passed:.3f}):"
                f" a request longer than max_request_s ({max_request_s} s), or a clock step"
            )
            _bad(BadLine(str(path), number, problem), on_bad_line)
            continue
        heapq.heappush(held, (arrival, number, record))
        latest_end = max(latest_end, record.ended_unix_s)
        while held and held[0][0] <= latest_end - max_request_s:
            passed, _, ready = heapq.heappop(held)
            yield ready
    while held:
        passed, _, ready = heapq.heappop(held)
        yield ready


def _bad(bad: BadLine, on_bad_line: OnBadLine | None) -> None:
    if on_bad_line is None:
        raise RequestLogError(str(bad), bad)
    on_bad_line(bad)
