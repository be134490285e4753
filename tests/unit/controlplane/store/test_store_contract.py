"""The state store's contract (controlplane/store/base.py), one suite run against both stores:
SQLite in a file, and a real PostgreSQL server (tests/postgres.py)."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from controlplane.core.overrides import Override
from controlplane.core.snapshot import TenantLoad
from controlplane.decision_log import (
    DecisionLog,
    DecisionOutcome,
    DecisionRecord,
    LoggedDecision,
    rebuild,
)
from controlplane.store.base import ChangeConflict, HistoryQuery, StateStore, StoreError
from controlplane.store.codec import decode_override, encode_override
from controlplane.store.postgresql import PostgresStateStore
from controlplane.store.sqlite import SqliteStateStore
from tests.postgres import PostgresServer

StoreFactory = Callable[[], StateStore]
"""A new store object over the same database each call (a restarted control plane)."""


@pytest.fixture(params=["sqlite", "postgresql"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "sqlite":
        path = str(tmp_path / "state" / "store.sqlite3")
        return lambda: SqliteStateStore(path)
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = server.new_database()
    return lambda: PostgresStateStore(dsn, connect_timeout_s=5)


@pytest.fixture
async def store(new_store: StoreFactory) -> AsyncIterator[StateStore]:
    opened = new_store()
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def _change(pool: str, version: int, tenant: str = "t", **fields: object) -> Override:
    return Override(
        pool=pool,
        config_version=version,
        kind="update_tenant",
        tenant=tenant,
        settings={"floor_slots": version},
        file_fields={f"tenants/{tenant}/floor_slots": "1"},
        stored_at_wall_s=1000.0 + version,
        **fields,  # type: ignore[arg-type]
    )


async def test_changes_come_back_whole_by_pool_and_version(store: StateStore) -> None:
    added = Override(
        pool="p",
        config_version=2,
        kind="add_tenant",
        tenant="new",
        settings={"floor_slots": 2, "weight": 1.5},
        key_digests=(b"\x01" * 32, b"\x02" * 32),
        file_fields={"tenants/new": None},
        stored_at_wall_s=12.5,
    )
    await store.add_change(_change("p", 4))
    await store.add_change(added)
    await store.add_change(_change("q", 2))
    await store.add_change(_change("p", 3, clear=("ceiling_slots",)))
    every = await store.changes()
    assert [(c.override.pool, c.override.config_version) for c in every] == [
        ("p", 2),
        ("p", 3),
        ("p", 4),
        ("q", 2),
    ]
    assert every[0].override == added
    assert every[1].override.clear == ("ceiling_slots",)
    assert [c.override.pool for c in await store.changes("q")] == ["q"]
    assert (await store.counters("p")).config_version == 4


async def test_a_taken_config_version_is_a_conflict_and_changes_nothing(
    store: StateStore,
) -> None:
    await store.add_change(_change("p", 2, tenant="a"))
    with pytest.raises(ChangeConflict):
        await store.add_change(_change("p", 2, tenant="b"))
    (only,) = await store.changes("p")
    assert only.override.tenant == "a"


async def test_dropped_changes_say_why_and_a_reset_keeps_the_counters(
    store: StateStore,
) -> None:
    for version in (2, 3):
        await store.add_change(_change("p", version))
    await store.add_change(_change("q", 2))
    await store.drop_change("p", 2, reason="the config file changed tenants/t/floor_slots")
    first, second = await store.changes("p")
    assert first.dropped_reason == "the config file changed tenants/t/floor_slots"
    assert first.dropped_at_wall_s is not None
    assert second.dropped_reason is None and second.dropped_at_wall_s is None
    assert await store.reset_changes("p") == 2
    assert await store.changes("p") == []
    assert len(await store.changes("q")) == 1
    assert (await store.counters("p")).config_version == 3, "versions go on growing"
    assert await store.reset_changes() == 1
    assert await store.changes() == []


async def test_counters_only_grow(store: StateStore) -> None:
    assert (await store.counters("p")).allocation_version == 0
    await store.raise_counters("p", allocation_version=1_000_000, decision_id=7)
    await store.raise_counters("p", allocation_version=5, decision_id=3)
    counters = await store.counters("p")
    assert (counters.allocation_version, counters.decision_id) == (1_000_000, 7)
    assert (await store.counters("q")).allocation_version == 0


def _logged(count: int, *, keyframe_every: int, pool: str = "p") -> list[LoggedDecision]:
    """Decisions as the log hands them to its sink: tenants coming and going, every decision's
    version its id, made at second 100 + id."""
    sunk: list[LoggedDecision] = []
    log = DecisionLog(4, on_logged=sunk.append, keyframe_every=keyframe_every)
    for index in range(count):
        tenants = ["A", "B", "C"][: 1 + index % 3]
        decision_id = log.next_id()
        log.append(
            DecisionRecord(
                id=decision_id,
                pool=pool,
                decided_at_wall_s=100.0 + decision_id,
                policy="demand",
                trigger="period",
                outcome=DecisionOutcome.PUBLISHED,
                reason=f"decision {decision_id}",
                version=decision_id,
                budget_slots=8,
                inputs={t: TenantLoad(in_flight=index, demand_age_s=0.5) for t in tenants},
                telemetry=None,
                outputs={t: index % 4 for t in tenants},
                duration_ms=0.5,
            )
        )
    return sunk


def _whole(entries: list[LoggedDecision]) -> list[DecisionRecord]:
    return rebuild(entries, from_id=1)


@pytest.mark.parametrize(
    ("query", "ids"),
    [
        pytest.param(HistoryQuery(limit=100), list(range(1, 21)), id="everything"),
        pytest.param(HistoryQuery(limit=3, since_version=7), [7, 8, 9], id="since-version"),
        pytest.param(HistoryQuery(limit=4, since_wall_s=117.0), [17, 18, 19, 20], id="since-time"),
        pytest.param(
            HistoryQuery(limit=2, since_version=3, after_decision_id=10), [11, 12], id="page-on"
        ),
        pytest.param(
            HistoryQuery(limit=5, since_version=5, since_wall_s=110.0),
            [10, 11, 12, 13, 14],
            id="both",
        ),
        pytest.param(HistoryQuery(limit=5, since_version=21), [], id="nothing-since"),
    ],
)
async def test_history_reads_rebuild_whole_records(
    store: StateStore, query: HistoryQuery, ids: list[int]
) -> None:
    logged = _logged(20, keyframe_every=4)
    await store.add_decisions(logged[:8])
    await store.add_decisions(logged[8:])
    entries = await store.decisions("p", query)
    first = ids[0] if ids else 0
    assert not entries or entries[0].keyframe, "a read starts at a key frame"
    records = rebuild(entries, from_id=first)
    assert [r.id for r in records] == ids
    expected = {r.id: r for r in _whole(logged)}
    for record in records:
        assert record == expected[record.id]
    assert (await store.counters("p")).decision_id == 20


async def test_pools_keep_their_own_history(store: StateStore) -> None:
    await store.add_decisions(_logged(3, keyframe_every=2, pool="p"))
    await store.add_decisions(_logged(5, keyframe_every=2, pool="q"))
    assert len(await store.decisions("p", HistoryQuery(limit=10))) == 3
    assert [e.record.pool for e in await store.decisions("q", HistoryQuery(limit=10))] == ["q"] * 5


async def test_retention_deletes_in_key_frame_steps_and_keeps_what_reads_need(
    store: StateStore,
) -> None:
    logged = _logged(20, keyframe_every=4)
    await store.add_decisions(logged)
    # By count: the newest 6 (15..20) are kept; their key frame is 13, so 13 and 14 stay too.
    assert await store.prune_decisions(older_than_wall_s=0.0, keep_count=6) == 12
    kept = await store.decisions("p", HistoryQuery(limit=100))
    assert [e.record.id for e in kept] == list(range(13, 21))
    expected = {r.id: r for r in _whole(logged)}
    assert rebuild(kept, from_id=13) == [expected[i] for i in range(13, 21)]
    # By age: decisions before second 119 go; 19 and 20 need key frame 17.
    assert await store.prune_decisions(older_than_wall_s=119.0, keep_count=100) == 4
    assert [e.record.id for e in await store.decisions("p", HistoryQuery(limit=100))] == [
        17,
        18,
        19,
        20,
    ]
    # All too old: the newest key frame and what follows it stay (the decision-id counter too).
    assert await store.prune_decisions(older_than_wall_s=1e12, keep_count=100) == 0
    assert (await store.counters("p")).decision_id == 20


async def test_everything_survives_a_new_store_over_the_same_database(
    new_store: StoreFactory,
) -> None:
    first = new_store()
    await first.open()
    await first.add_change(_change("p", 2))
    await first.raise_counters("p", allocation_version=42)
    await first.add_decisions(_logged(5, keyframe_every=2))
    await first.close()
    second = new_store()
    await second.open()
    try:
        assert [c.override for c in await second.changes()] == [_change("p", 2)]
        counters = await second.counters("p")
        assert (counters.config_version, counters.allocation_version, counters.decision_id) == (
            2,
            42,
            5,
        )
        assert len(await second.decisions("p", HistoryQuery(limit=10))) == 5
    finally:
        await second.close()


async def test_a_closed_store_refuses_calls(new_store: StoreFactory) -> None:
    store = new_store()
    with pytest.raises(StoreError, match="not open"):
        await store.changes()
    await store.open()
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.counters("p")


async def test_a_schema_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "newer.sqlite3"
    store = SqliteStateStore(str(path))
    await store.open()
    await store.close()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE slotshift_schema SET version = 99")
    with pytest.raises(StoreError, match="newer than this slotshift"):
        await SqliteStateStore(str(path)).open()


async def test_an_unreachable_postgresql_is_a_store_error(tmp_path: Path) -> None:
    store = PostgresStateStore(f"host={tmp_path} dbname=none", connect_timeout_s=1)
    with pytest.raises(StoreError, match="postgresql"):
        await store.open()


async def test_the_gateways_of_a_pool_are_replaced_whole(store: StateStore) -> None:
    assert await store.gateways("p") == []
    await store.set_gateways("p", ["gw-b", "gw-a", "gw-a"])
    await store.set_gateways("q", ["gw-q"])
    assert await store.gateways("p") == ["gw-a", "gw-b"]
    await store.set_gateways("p", ["gw-c"])
    assert await store.gateways("p") == ["gw-c"]
    assert await store.gateways("q") == ["gw-q"]


async def test_one_holder_at_a_time_each_taking_a_higher_epoch(store: StateStore) -> None:
    first = await store.acquire_lease("leader", "a", ttl_s=30.0)
    assert (first.holder, first.epoch) == ("a", 1)
    assert 29.0 < first.remaining_s <= 30.0
    refused = await store.acquire_lease("leader", "b", ttl_s=30.0)
    assert (refused.holder, refused.epoch) == ("a", 1)
    assert 0 < refused.remaining_s <= 30.0
    assert await store.renew_lease("leader", "a", 1, ttl_s=30.0)
    assert not await store.renew_lease("leader", "b", 1, ttl_s=30.0)
    # A replica restarted under the same name takes its own lease back at once, newer.
    again = await store.acquire_lease("leader", "a", ttl_s=30.0)
    assert (again.holder, again.epoch) == ("a", 2)
    assert not await store.renew_lease("leader", "a", 1, ttl_s=30.0)


async def test_an_expired_or_released_lease_goes_to_the_next(store: StateStore) -> None:
    await store.acquire_lease("leader", "a", ttl_s=0.001)
    # The store's clock moves on its own; 1 ms is soon gone (each call takes longer).
    taken = await store.acquire_lease("leader", "b", ttl_s=30.0)
    for _ in range(100):
        if taken.holder == "b":
            break
        taken = await store.acquire_lease("leader", "b", ttl_s=30.0)
    assert (taken.holder, taken.epoch) == ("b", 2)
    assert not await store.renew_lease("leader", "a", 1, ttl_s=30.0)
    await store.release_lease("leader", "a", 1)  # not a's: nothing happens
    assert (await store.acquire_lease("leader", "c", ttl_s=30.0)).holder == "b"
    await store.release_lease("leader", "b", 2)
    assert not await store.renew_lease("leader", "b", 2, ttl_s=30.0)
    taken = await store.acquire_lease("leader", "c", ttl_s=30.0)
    assert (taken.holder, taken.epoch) == ("c", 3)
    other = await store.acquire_lease("other", "a", ttl_s=30.0)
    assert (other.holder, other.epoch) == ("a", 1)


async def test_the_lease_outlives_the_store_object(new_store: StoreFactory) -> None:
    store = new_store()
    await store.open()
    try:
        await store.acquire_lease("leader", "a", ttl_s=30.0)
    finally:
        await store.close()
    store = new_store()
    await store.open()
    try:
        lease = await store.acquire_lease("leader", "b", ttl_s=30.0)
    finally:
        await store.close()
    assert (lease.holder, lease.epoch) == ("a", 1)


def test_an_override_stored_before_keyed_digests_decodes_as_unkeyed() -> None:
    body = (
        '{"pool":"p","config_version":2,"kind":"add_tenant","tenant":"C","settings":{},'
        '"clear":[],"policy":"","key_digests":["00ff"],"file_fields":{},"stored_at_wall_s":1.0}'
    )
    override = decode_override(body)
    assert (override.key_scheme, override.allow_no_key) == ("sha256", False)
    keyed = dataclasses.replace(override, key_scheme="hmac-sha256:0123abcd", allow_no_key=True)
    assert decode_override(encode_override(keyed)) == keyed
