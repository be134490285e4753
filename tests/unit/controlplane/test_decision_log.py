"""controlplane/decision_log.py: records stored as changes, read back whole or as stored."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.snapshot import TenantLoad
from controlplane.decision_log import (
    DecisionLog,
    DecisionOutcome,
    DecisionRecord,
    LoggedDecision,
    rebuild,
)


def _record(
    decision_id: int, inputs: dict[str, TenantLoad], outputs: dict[str, int]
) -> DecisionRecord:
    return DecisionRecord(
        id=decision_id,
        pool="p",
        decided_at_wall_s=float(decision_id),
        policy="slo",
        trigger="period",
        outcome=DecisionOutcome.HELD,
        reason="",
        version=decision_id,
        budget_slots=10,
        inputs=inputs,
        telemetry=None,
        outputs=outputs,
        duration_ms=1.0,
    )


def test_a_record_keeps_only_the_tenants_whose_figures_or_limits_changed() -> None:
    log = DecisionLog(8)
    log.append(_record(1, {"A": TenantLoad(2), "B": TenantLoad(1)}, {"A": 5, "B": 5}))
    log.append(
        _record(
            2,
            {"A": TenantLoad(2, demand_age_s=0.4), "B": TenantLoad(3)},
            {"A": 4, "B": 6},
        )
    )
    log.append(
        _record(3, {"A": TenantLoad(2, demand_age_s=1.9), "B": TenantLoad(3)}, {"A": 4, "B": 6})
    )
    third, second, first = log.newest(3, changes_only=True)
    assert set(first.inputs) == {"A", "B"} and set(first.outputs) == {"A", "B"}
    assert set(second.inputs) == {"A", "B"}, "A's age appeared, B's in-flight moved"
    assert second.outputs == {"A": 4, "B": 6}
    assert set(third.inputs) == {"A"}, "A's age moved by more than a second"
    assert third.outputs == {}
    whole = log.newest(1)[0]
    assert whole.inputs == {"A": TenantLoad(2, demand_age_s=1.9), "B": TenantLoad(3)}
    assert whole.outputs == {"A": 4, "B": 6}


@given(st.integers(1, 6), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_whole_records_read_back_equal_what_was_logged(capacity: int, seed: int) -> None:
    """Contract: newest(n) returns, whole, the last n records appended, whatever the eviction,
    with tenants coming and going; the figures equal, the ages within the tolerance."""
    rng = random.Random(seed)
    log = DecisionLog(capacity)
    logged: list[DecisionRecord] = []
    tenants = ["A", "B", "C", "D"]
    for decision_id in range(1, 15):
        present = [t for t in tenants if rng.random() < 0.8]
        inputs = {
            t: TenantLoad(
                rng.randint(0, 2), rng.randint(0, 1), demand_age_s=rng.choice([None, 0.5])
            )
            for t in present
        }
        outputs = {t: rng.randint(0, 3) for t in present}
        record = _record(decision_id, inputs, outputs)
        log.append(record)
        logged.append(record)
        limit = rng.randint(1, capacity + 1)
        expected = list(reversed(logged))[: min(limit, capacity)]
        got = log.newest(limit)
        assert [r.id for r in got] == [r.id for r in expected]
        for have, want in zip(got, expected, strict=True):
            assert have.outputs == want.outputs
            assert have.inputs == want.inputs
    assert len(log) == min(capacity, 14)


@given(st.integers(1, 5), st.integers(0, 2**32 - 1), st.integers(1, 14))
@settings(max_examples=200, deadline=None)
def test_what_the_sink_gets_rebuilds_whole_from_any_key_frame(
    keyframe_every: int, seed: int, from_id: int
) -> None:
    """Contract: the entries the sink gets (every keyframe_every-th whole, the first too), read
    from the key frame at or before any decision on, rebuild every record whole; read from
    elsewhere they would not (a key frame is where a reader may start)."""
    rng = random.Random(seed)
    sunk: list[LoggedDecision] = []
    log = DecisionLog(3, first_id=1, on_logged=sunk.append, keyframe_every=keyframe_every)
    logged: list[DecisionRecord] = []
    for _ in range(14):
        present = [t for t in ["A", "B", "C", "D"] if rng.random() < 0.8]
        inputs = {t: TenantLoad(rng.randint(0, 2), rng.randint(0, 1)) for t in present}
        record = _record(log.next_id(), inputs, {t: rng.randint(0, 3) for t in present})
        log.append(record)
        logged.append(record)
    assert [e.keyframe for e in sunk] == [i % keyframe_every == 0 for i in range(14)]
    start = max(i for i, e in enumerate(sunk) if e.keyframe and e.record.id <= from_id)
    rebuilt = rebuild(sunk[start:], from_id=from_id)
    assert [r.id for r in rebuilt] == list(range(from_id, 15))
    for have, want in zip(rebuilt, logged[from_id - 1 :], strict=True):
        assert (have.inputs, have.outputs) == (want.inputs, want.outputs)
    as_stored = rebuild(sunk[start:], from_id=from_id, changes_only=True)
    assert as_stored == [e.record for e in sunk[from_id - 1 :]]


def test_ids_continue_from_first_id_and_a_requested_key_frame_comes_next() -> None:
    sunk: list[LoggedDecision] = []
    log = DecisionLog(4, first_id=41, on_logged=sunk.append, keyframe_every=100)
    for _ in range(3):
        log.append(_record(log.next_id(), {"A": TenantLoad(1)}, {"A": 1}))
    log.request_keyframe()
    log.append(_record(log.next_id(), {"A": TenantLoad(1)}, {"A": 1}))
    assert [e.record.id for e in sunk] == [41, 42, 43, 44]
    assert [e.keyframe for e in sunk] == [True, False, False, True]
    assert sunk[3].record.inputs == {"A": TenantLoad(1)}, "a key frame is whole"
    assert sunk[2].record.inputs == {}, "nothing changed since the one before"
