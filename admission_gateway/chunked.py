"""Where an engine connection's bytes stand in HTTP/1.1 chunked framing, read by read (pure).

A relayed stream's events may go to the client as the engine framed them (upstream.py,
`PushedReads`' framed take): the client's body is chunked as the engine's is, so a read that
holds whole chunks, beginning where a chunk begins, can be written to the client byte for byte,
without the parser, the answer's body buffer, or framing it again. That is sound only while the
parser, which does not see such a read, stands between two chunks, where it stood before it;
`ChunkedFraming` follows every read of a response from its first byte to know when it does.

What it proves is deliberately narrow. It follows one response from `reset` (called as the request
that the response answers is sent): the head, up to its blank line, must be a final
status (not 1xx) with `Transfer-Encoding: chunked` and no Content-Length; then each read must end
where a chunk ends. Anything else (a read ending inside a chunk or its header, a chunk
extension, trailers after the last chunk, a head it cannot read) ends the following for the rest
of the response: its reads all go to the parser, as every read did before.
"""

from __future__ import annotations

import re
from typing import Final

_HEAD_END: Final = b"\r\n\r\n"
_MAX_HEAD_BYTES: Final = 64 * 1024
"""A head longer than this is not followed (no engine sends one)."""
_MAX_SIZE_LINE: Final = 17
"""A chunk's size line with no extension (what vLLM and the gateway's own peers send): up to
15 hex digits and its CRLF."""
_CHUNKED: Final = re.compile(rb"\r\ntransfer-encoding:[ \t]*chunked[ \t]*\r\n", re.IGNORECASE)
_CONTENT_LENGTH: Final = re.compile(rb"\r\ncontent-length:", re.IGNORECASE)

_OFF: Final = 0
"""Not following: before the first response, after the last chunk, or after a read it could
not place (every read goes to the parser)."""
_HEAD: Final = 1
_BETWEEN_CHUNKS: Final = 2


class ChunkedFraming:
    """One connection's place in its current response's framing."""

    __slots__ = ("_head", "_state", "following")

    def __init__(self) -> None:
        self._state = _OFF
        self._head = b""
        self.following = False
        """Whether it follows the current response (a read given to `whole_chunks` now may be
        placed); False: every read goes to the parser, and `whole_chunks` need not be asked."""

    def reset(self) -> None:
        """A new response begins with the next byte read (its request was just sent)."""
        self._state = _HEAD
        self._head = b""
        self.following = True

    def whole_chunks(self, data: bytes, at: int = 0) -> bool:
        """Follow one read (from `at`); True when it is one or more whole chunks of data, none
        the last, and began between two chunks: the parser would be between two chunks after
        it, as it was before it, so it may skip the read."""
        state = self._state
        if state != _BETWEEN_CHUNKS:
            if state == _HEAD:
                self._read_head(data)
            return False
        length = len(data)
        if at == length:
            return False
        find = data.find
        while True:
            line_end = find(b"\r\n", at, at + _MAX_SIZE_LINE)
            size_text = data[at:line_end]
            # isalnum: int() would also take a sign, blanks or underscores, which HTTP does not.
            if line_end <= at or not size_text.isalnum():
                break
            try:
                size = int(size_text, 16)
            except ValueError:
                break
            end = line_end + 2 + size
            if size == 0 or not data.startswith(b"\r\n", end):
                # The last chunk (trailers may follow), or a read that ends inside a chunk.
                break
            at = end + 2
            if at == length:
                return True
        self.stop()
        return False

    def _read_head(self, data: bytes) -> None:
        head = self._head + data
        end = head.find(_HEAD_END)
        if end < 0:
            self._head = head
            if len(head) > _MAX_HEAD_BYTES:
                self.stop()
            return
        self._head = b""
        block = head[: end + 2]
        if (
            not block.startswith(b"HTTP/1.1 ")
            or block.startswith(b"HTTP/1.1 1")
            or _CHUNKED.search(block) is None
            or _CONTENT_LENGTH.search(block) is not None
        ):
            self.stop()
            return
        self._state = _BETWEEN_CHUNKS
        # What follows the head in this read goes to the parser with it; this only finds
        # where it leaves the parser.
        self.whole_chunks(head, end + len(_HEAD_END))

    def stop(self) -> None:
        """Follow nothing more of this response (every read goes to the parser)."""
        self._state = _OFF
        self._head = b""
        self.following = False


def chunks_data(read: bytes) -> bytes:
    """The data of `read`, one or more whole chunks of a chunked body, none the last, each size
    line without an extension (what `ChunkedFraming.whole_chunks` placed)."""
    parts = []
    at, length = 0, len(read)
    while at < length:
        line_end = read.index(b"\r\n", at)
        start = line_end + 2
        end = start + int(read[at:line_end], 16)
        parts.append(read[start:end])
        at = end + 2
    return b"".join(parts)
