"""ChunkedFraming (admission_gateway/chunked.py): a read may skip the parser only when it is whole
data chunks beginning between two chunks of a chunked response; anything it cannot place ends the
following for the rest of the response."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from admission_gateway.chunked import ChunkedFraming, chunks_data

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
LAST = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def following(head: bytes = HEAD) -> ChunkedFraming:
    framing = ChunkedFraming()
    framing.reset()
    assert framing.whole_chunks(head) is False  # the head always goes to the parser
    return framing


def test_reads_of_whole_chunks_after_the_head_skip_the_parser_until_the_last_chunk() -> None:
    framing = following()
    assert framing.whole_chunks(chunk(b"data: 1\n\n"))
    assert framing.whole_chunks(chunk(b"data: 2\n\n") + chunk(b"data: 3\n\n"))
    assert not framing.whole_chunks(chunk(b"data: [DONE]\n\n") + LAST)
    # The response is over: nothing more is placed until the next one begins.
    assert not framing.whole_chunks(chunk(b"data: 4\n\n"))
    framing.reset()
    assert not framing.whole_chunks(HEAD + chunk(b"data: 5\n\n"))
    assert framing.whole_chunks(chunk(b"data: 6\n\n"))


def test_nothing_is_placed_before_a_response_begins() -> None:
    assert not ChunkedFraming().whole_chunks(chunk(b"data: 1\n\n"))


def test_a_head_split_over_reads_and_chunks_in_the_heads_read_are_followed() -> None:
    framing = ChunkedFraming()
    framing.reset()
    assert not framing.whole_chunks(HEAD[:20])
    assert not framing.whole_chunks(HEAD[20:] + chunk(b"data: 1\n\n"))
    assert framing.whole_chunks(chunk(b"data: 2\n\n"))


def test_a_read_that_ends_inside_a_chunk_ends_the_following() -> None:
    whole = chunk(b"data: 1\n\n")
    for cut in range(1, len(whole)):
        framing = following()
        assert not framing.whole_chunks(whole[:cut])
        assert not framing.whole_chunks(whole[cut:])
        # Even a read that looks whole: the parser may be anywhere now.
        assert not framing.whole_chunks(chunk(b"data: 2\n\n"))


def test_the_head_of_the_heads_read_ending_inside_a_chunk_ends_the_following() -> None:
    framing = following(HEAD + chunk(b"data: 1\n\n")[:5])
    assert not framing.whole_chunks(chunk(b"data: 2\n\n"))


def test_responses_that_are_not_plainly_chunked_are_never_followed() -> None:
    heads = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 12\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Transfer-Encoding: chunked\r\n\r\n",
    ]
    for head in heads:
        framing = following(head)
        assert not framing.whole_chunks(chunk(b"data: 1\n\n")), head
    # The header's name is case-insensitive.
    framing = following(b"HTTP/1.1 200 OK\r\ntransfer-ENCODING:  chunked\r\n\r\n")
    assert framing.whole_chunks(chunk(b"data: 1\n\n"))


def test_size_lines_http_does_not_allow_end_the_following() -> None:
    for size_line in (b"+9", b" 9", b"0_9", b"9;ext=1", b"g", b""):
        framing = following()
        assert not framing.whole_chunks(size_line + b"\r\ndata: 1\n\n\r\n"), size_line
        assert not framing.whole_chunks(chunk(b"data: 2\n\n"))


@given(
    st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=12),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=6),
)
def test_a_read_is_placed_exactly_when_the_reads_before_it_ended_between_chunks(
    payloads: list[bytes], cuts: list[int]
) -> None:
    # The stream cut anywhere into reads: a read is whole chunks only if every cut so far fell
    # between chunks; after the first cut inside a chunk, nothing is placed again.
    body = b"".join(chunk(p) for p in payloads)
    ends = set(_ends(payloads))
    points = [*sorted({c % len(body) for c in cuts} - {0}), len(body)]
    framing = following()
    start, lost = 0, False
    for point in points:
        placed = framing.whole_chunks(body[start:point])
        expected = not lost and point in ends
        assert placed is expected
        if placed:
            # What a placed read holds is its chunks' data, byte for byte (any bytes, CRLFs too).
            assert chunks_data(body[start:point]) == b"".join(
                p for p, end in zip(payloads, _ends(payloads), strict=True) if start < end <= point
            )
        lost = lost or point not in ends
        start = point


def _ends(payloads: list[bytes]) -> list[int]:
    """Where each payload's chunk ends in the body of their chunks."""
    ends, position = [], 0
    for payload in payloads:
        position += len(chunk(payload))
        ends.append(position)
    return ends
