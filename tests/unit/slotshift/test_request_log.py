"""The request log: records, the buffered writer with rotation, reading and merging by arrival."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from slotshift.request_log import (
    BadLine,
    Outcome,
    RequestLogError,
    RequestLogWriter,
    RequestRecord,
    SessionHasher,
    merge_logs,
    read_log,
    session_key_from_text,
)

KEY = b"0123456789abcdef-session-key"


def record(arrival_unix_s: float, e2e_ms: float = 10.0, **fields: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "arrival_unix_s": arrival_unix_s,
        "gateway": "gw-0",
        "pool": "p",
        "tenant": "A",
        "route": "/v1/completions",
        "streamed": True,
        "outcome": Outcome.COMPLETED,
        "e2e_ms": e2e_ms,
    }
    return RequestRecord(**(base | fields))


def writer(path: Path, **overrides: Any) -> RequestLogWriter:
    settings: dict[str, Any] = {
        "max_bytes_per_file": 1 << 20,
        "files_kept": 2,
        "flush_interval_s": 60.0,
        "max_buffered_records": 1000,
    }
    return RequestLogWriter(path, **(settings | overrides))


def write_lines(path: Path, records: list[RequestRecord], *extra: str) -> None:
    lines = [r.model_dump_json() for r in records] + list(extra)
    path.write_text("".join(line + "\n" for line in lines))


def files(folder: Path) -> dict[str, int]:
    """The files in `folder` and their sizes."""
    return {p.name: p.stat().st_size for p in folder.iterdir()}


# -- records and sessions --


def test_a_record_round_trips_through_its_line() -> None:
    original = record(1.7e9, prompt_tokens=12, output_tokens=34, output_tokens_from="usage")
    assert RequestRecord.model_validate_json(original.model_dump_json()) == original
    assert original.ended_unix_s == pytest.approx(1.7e9 + 0.01)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"e2e_ms": -1.0}, id="negative-latency"),
        pytest.param({"output_tokens": -3}, id="negative-count"),
        pytest.param({"outcome": "exploded"}, id="unknown-outcome"),
        pytest.param({"prompt": "hello"}, id="unknown-field"),
        pytest.param({"v": 2}, id="other-version"),
    ],
)
def test_a_record_refuses_what_its_schema_does_not_allow(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        record(1.0, **bad)


def test_a_session_hash_is_stable_keyed_and_per_tenant() -> None:
    hasher = SessionHasher(KEY)
    digest = hasher.session("A", "alice@example.com")
    assert digest == hasher.session("A", "alice@example.com")
    assert len(digest) == 32
    assert "alice" not in digest
    assert digest != hasher.session("B", "alice@example.com")
    assert digest != SessionHasher(KEY + b"x").session("A", "alice@example.com")


def test_a_short_session_key_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        SessionHasher(b"short")
    with pytest.raises(ValueError, match="at least 16"):
        session_key_from_text("short\n")
    assert session_key_from_text("  0123456789abcdef  \nignored\n") == b"0123456789abcdef"


# -- the writer --


async def test_written_records_reach_the_file_only_when_flushed(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = writer(path)
    await log.open()
    log.write(record(1.0))
    log.write(record(2.0))
    assert log.buffered == 2
    assert path.read_bytes() == b""
    await log.flush()
    assert [r.arrival_unix_s for r in read_log(path)] == [1.0, 2.0]
    await log.close()
    assert (log.written_total, log.dropped_total) == (2, 0)


async def test_close_writes_what_is_left_and_drops_what_comes_later(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = writer(path)
    log.write(record(1.0))
    await log.close()
    log.write(record(2.0))
    await log.close()
    assert [r.arrival_unix_s for r in read_log(path)] == [1.0]
    assert log.dropped_total == 1


async def test_a_full_buffer_drops_records_rather_than_wait(tmp_path: Path) -> None:
    log = writer(tmp_path / "log.jsonl", max_buffered_records=2)
    for t in range(5):
        log.write(record(float(t)))
    assert (log.buffered, log.dropped_total) == (2, 3)
    await log.close()
    assert [r.arrival_unix_s for r in read_log(log.path)] == [0.0, 1.0]


async def test_a_restarted_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    for t in (1.0, 2.0):
        log = writer(path)
        log.write(record(t))
        await log.close()
    assert [r.arrival_unix_s for r in read_log(path)] == [1.0, 2.0]


async def test_files_rotate_by_size_at_line_boundaries_keeping_files_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    line_bytes = len(record(0.0).model_dump_json()) + 1
    # Three lines a file; eleven lines over two flushes: files of 3, 3, 3 and 2 lines, of
    # which the oldest (lines 0-2) is deleted as files_kept is 2.
    log = writer(path, max_bytes_per_file=3 * line_bytes + line_bytes // 2, files_kept=2)
    for t in range(7):
        log.write(record(float(t)))
    await log.flush()
    for t in range(7, 11):
        log.write(record(float(t)))
    await log.close()
    assert sorted(files(tmp_path)) == ["log.jsonl", "log.jsonl.1", "log.jsonl.2"]

    def arrivals(name: str) -> list[float]:
        return [r.arrival_unix_s for r in read_log(tmp_path / name)]

    assert arrivals("log.jsonl.2") == [3.0, 4.0, 5.0]
    assert arrivals("log.jsonl.1") == [6.0, 7.0, 8.0]
    assert arrivals("log.jsonl") == [9.0, 10.0]
    assert all(size <= 3 * line_bytes for size in files(tmp_path).values())


async def test_a_write_that_fails_is_counted_and_the_writer_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "log.jsonl"
    log = writer(path)
    with pytest.raises(FileNotFoundError):
        await log.open()
    log.write(record(1.0))
    await log.flush()
    assert log.dropped_total == 1
    path.parent.mkdir()
    log.write(record(2.0))
    await log.close()
    assert [r.arrival_unix_s for r in read_log(path)] == [2.0]


# -- reading and merging --


def test_a_bad_line_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    torn = record(3.0).model_dump_json()[:40]
    write_lines(path, [record(1.0), record(2.0)], torn)
    with pytest.raises(RequestLogError) as caught:
        list(read_log(path))
    assert caught.value.bad is not None
    assert (caught.value.bad.path, caught.value.bad.line) == (str(path), 3)
    assert str(caught.value).startswith(f"{path}:3: ")


def test_bad_lines_may_be_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_lines(path, [record(1.0)], "not json", json.dumps({"tenant": "A"}))
    with path.open("a") as handle:
        handle.write(record(2.0).model_dump_json() + "\n")
    bad: list[BadLine] = []
    assert [r.arrival_unix_s for r in read_log(path, on_bad_line=bad.append)] == [1.0, 2.0]
    assert [b.line for b in bad] == [2, 3]
    assert "arrival_unix_s" in bad[1].problem


def test_a_missing_file_is_a_request_log_error(tmp_path: Path) -> None:
    with pytest.raises(RequestLogError, match="cannot read"):
        list(read_log(tmp_path / "none.jsonl"))


def test_merge_orders_several_files_by_arrival_though_each_is_in_end_order(
    tmp_path: Path,
) -> None:
    # Each file in the order requests ended: a long request that arrived first comes last.
    first, second = tmp_path / "gw-0.jsonl", tmp_path / "gw-1.jsonl"
    write_lines(
        first,
        [
            record(10.5, 100, gateway="gw-0"),
            record(11.0, 200, gateway="gw-0"),
            record(10.0, 5000, gateway="gw-0"),
            record(16.0, 10, gateway="gw-0"),
        ],
    )
    write_lines(
        second,
        [
            record(10.2, 50, gateway="gw-1"),
            record(12.0, 50, gateway="gw-1"),
            record(11.0, 3000, gateway="gw-1"),
        ],
    )
    merged = list(merge_logs([first, second], max_request_s=10.0))
    assert [(r.arrival_unix_s, r.gateway) for r in merged] == [
        (10.0, "gw-0"),
        (10.2, "gw-1"),
        (10.5, "gw-0"),
        (11.0, "gw-0"),
        (11.0, "gw-1"),
        (12.0, "gw-1"),
        (16.0, "gw-0"),
    ]


def test_merge_streams_rather_than_reads_everything_first(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_lines(path, [record(float(t)) for t in range(100)], "not json")
    merged = merge_logs([path], max_request_s=1.0)
    # The bad last line is only met when the merge reaches it.
    assert [next(merged).arrival_unix_s for _ in range(50)] == [float(t) for t in range(50)]
    with pytest.raises(RequestLogError, match=r":101: "):
        list(merged)


def test_a_record_later_than_max_request_s_allows_is_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    # The third lasted 100 s, but the merge was told no request lasts over 10 s.
    write_lines(path, [record(50.0, 10), record(70.0, 10), record(20.0, 100_000)])
    with pytest.raises(RequestLogError, match=r"log.jsonl:3: arrived at 20.000"):
        list(merge_logs([path], max_request_s=10.0))
    bad: list[BadLine] = []
    merged = merge_logs([path], max_request_s=10.0, on_bad_line=bad.append)
    assert [r.arrival_unix_s for r in merged] == [50.0, 70.0]
    assert [b.line for b in bad] == [3]
    # Told the truth, the merge puts it first.
    assert [r.arrival_unix_s for r in merge_logs([path], max_request_s=200.0)] == [
        20.0,
        50.0,
        70.0,
    ]
