"""Replay: a merged request log becomes each tenant's open-loop sends and request shapes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from slotshift.request_log import Outcome, RequestRecord, merge_logs
from slotshift_tools.bench.arrivals import PROMPT_TOKEN_ID_RANGE
from slotshift_tools.replay import replay_schedule

T0 = 1_700_000_000.0


def record(offset_s: float, tenant: str = "A", **fields: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "arrival_unix_s": T0 + offset_s,
        "gateway": "gw-0",
        "pool": "p",
        "tenant": tenant,
        "route": "/v1/completions",
        "streamed": True,
        "max_tokens": 64,
        "prompt_tokens": 100,
        "output_tokens": 64,
        "output_tokens_from": "usage",
        "outcome": Outcome.COMPLETED,
        "e2e_ms": 500.0,
    }
    return RequestRecord(**(base | fields))


def test_each_tenant_gets_its_sends_from_the_first_arrival_with_the_recorded_lengths() -> None:
    schedule = replay_schedule(
        [
            record(0.0, "A", prompt_tokens=120, output_tokens=30),
            record(0.25, "B", prompt_tokens=2000, output_tokens=8, streamed=False),
            record(1.5, "A", prompt_tokens=90, output_tokens=64),
        ]
    )
    assert schedule.origin_unix_s == T0
    assert list(schedule.tenants) == ["A", "B"]
    a, b = schedule.tenants["A"], schedule.tenants["B"]
    assert a.send_times == [0.0, 1.5]
    assert [(r.prompt_tokens, r.output_tokens) for r in a.requests] == [(120, 30), (90, 64)]
    assert b.send_times == [0.25]
    assert (b.requests[0].prompt_tokens, b.requests[0].output_tokens) == (2000, 8)
    assert b.requests[0].streamed is False
    assert schedule.requests == 3
    # Every send is before the horizon, as a drawn schedule's.
    assert 1.5 < schedule.horizon_s < 1.5 + 1e-3
    assert schedule.left_out == {}


@pytest.mark.parametrize(
    ("fields", "output_tokens"),
    [
        pytest.param({}, 64, id="completed-gets-what-it-got"),
        pytest.param({"output_tokens": 12}, 12, id="completed-stopped-early"),
        pytest.param(
            {"outcome": "rejected", "reason": "queue_full", "output_tokens": None},
            64,
            id="rejected-asks-its-max-tokens",
        ),
        pytest.param(
            {"outcome": "timed_out", "output_tokens": 40, "max_tokens": None},
            40,
            id="timed-out-without-max-tokens-gets-what-it-reached",
        ),
        pytest.param(
            {"outcome": "cancelled", "output_tokens": 5}, 64, id="cancelled-asks-its-max-tokens"
        ),
        pytest.param(
            {"output_tokens": None, "max_tokens": None}, 7, id="nothing-known-takes-the-default"
        ),
        pytest.param({"output_tokens": 0}, 1, id="at-least-one"),
    ],
)
def test_the_output_length_replayed(fields: dict[str, Any], output_tokens: int) -> None:
    schedule = replay_schedule([record(0.0, **fields)], default_output_tokens=7)
    assert schedule.tenants["A"].requests[0].output_tokens == output_tokens


def test_what_cannot_be_replayed_is_left_out_and_counted() -> None:
    records = [
        record(0.0, outcome="invalid", reason="invalid_json", prompt_tokens=None),
        record(1.0, prompt_tokens=None),
        record(2.0, output_tokens=None, max_tokens=None),
        record(3.0),
    ]
    schedule = replay_schedule(records)
    assert schedule.left_out == {
        "invalid": 1,
        "prompt_tokens_unknown": 1,
        "output_tokens_unknown": 1,
    }
    assert schedule.tenants["A"].send_times == [0.0]
    with_defaults = replay_schedule(records, default_prompt_tokens=256, default_output_tokens=32)
    assert [
        (r.send_at_s, r.prompt_tokens, r.output_tokens) for r in with_defaults.tenants["A"].requests
    ] == [
        # From the first arrival replayed (the invalid one is not).
        (0.0, 256, 64),
        (1.0, 100, 32),
        (2.0, 100, 64),
    ]
    assert with_defaults.left_out == {"invalid": 1}


def test_a_window_pool_and_tenants_select_what_is_replayed() -> None:
    records = [
        record(0.0),
        record(10.0),
        record(11.0, "B"),
        record(12.0, pool="q"),
        record(20.0),
    ]
    schedule = replay_schedule(
        records, pool="p", tenants={"A"}, start_unix_s=T0 + 5.0, end_unix_s=T0 + 20.0
    )
    assert schedule.origin_unix_s == T0 + 5.0
    assert schedule.horizon_s == 15.0
    assert list(schedule.tenants) == ["A"]
    assert schedule.tenants["A"].send_times == [5.0]
    assert schedule.left_out == {"outside_window": 2, "other_tenant": 1, "other_pool": 1}


def test_cancellations_keep_when_the_client_went_away() -> None:
    schedule = replay_schedule(
        [record(0.0, outcome="cancelled", reason="client_disconnected", e2e_ms=2500.0), record(1.0)]
    )
    assert [r.cancel_after_s for r in schedule.tenants["A"].requests] == [2.5, None]
    assert [r.recorded for r in schedule.tenants["A"].requests] == [
        Outcome.CANCELLED,
        Outcome.COMPLETED,
    ]


def test_records_out_of_arrival_order_are_refused() -> None:
    with pytest.raises(ValueError, match="merge the logs first"):
        replay_schedule([record(1.0), record(0.5)])


def test_a_replayed_request_has_the_bench_shape() -> None:
    request = (
        replay_schedule([record(0.0, prompt_tokens=33, output_tokens=9)]).tenants["A"].requests[0]
    )
    shape = request.shape(random.Random(1))
    assert len(shape.prompt_token_ids) == 33
    assert shape.max_tokens == 9
    low, high = PROMPT_TOKEN_ID_RANGE
    assert all(low <= t < high for t in shape.prompt_token_ids)
    assert shape == request.shape(random.Random(1))


def test_two_gateways_logs_merge_into_one_schedule(tmp_path: Path) -> None:
    # Each gateway's file is in the order its requests ended.
    first, second = tmp_path / "gw-0.jsonl", tmp_path / "gw-1.jsonl"
    first.write_text(
        "".join(
            r.model_dump_json() + "\n"
            for r in (record(1.0, e2e_ms=100), record(0.0, e2e_ms=3000), record(4.0))
        )
    )
    second.write_text(
        "".join(
            r.model_dump_json() + "\n"
            for r in (record(0.5, "B", gateway="gw-1"), record(2.0, gateway="gw-1"))
        )
    )
    schedule = replay_schedule(merge_logs([first, second], max_request_s=60.0))
    assert schedule.tenants["A"].send_times == [0.0, 1.0, 2.0, 4.0]
    assert [r.gateway for r in schedule.tenants["A"].requests] == ["gw-0", "gw-0", "gw-1", "gw-0"]
    assert schedule.tenants["B"].send_times == [0.5]
