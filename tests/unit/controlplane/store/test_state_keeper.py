"""controlplane/state_keeper.py over a real SQLite store: a pool restored from stored changes,
versions and ids; decisions kept while the store cannot be written and written once it can;
the version ceiling kept ahead of what is published."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from controlplane.core.overrides import Override, apply, file_fields_of
from controlplane.decision_log import LoggedDecision
from controlplane.pool_state import PoolState
from controlplane.runtime import PoolRuntime
from controlplane.state_keeper import VERSION_LEASE, StaleKeyDigests, StateKeeper
from controlplane.store.base import HistoryQuery, StoreError
from controlplane.store.sqlite import SqliteStateStore
from slotshift.clock import ManualClock
from slotshift.config import PoolConfig, StateStoreConfig, TenantConfig
from slotshift.keys import KeyDigester

DIGESTER = KeyDigester.keyed("test-key-digest-secret-of-32-bytes")
"""The deployment's digester in these tests (keyed, as shipped configs are)."""


FILE = PoolConfig(
    name="p",
    budget_slots=20,
    tenants=[
        TenantConfig(name="A", floor_slots=4, api_keys=["key-a"]),
        TenantConfig(name="B", floor_slots=4, api_keys=["key-b"]),
    ],
)


class FlakyStore(SqliteStateStore):
    """A real SQLite store whose decision writes fail while `down`."""

    down = False

    async def add_decisions(self, entries: Sequence[LoggedDecision]) -> None:
        if self.down:
            raise StoreError("down")
        await super().add_decisions(entries)


def _runtime(file: PoolConfig, clock: ManualClock) -> PoolRuntime:
    state = PoolState(
        file,
        clock=clock,
        gateway_lease_ttl_s=1.0,
        telemetry_stale_after_s=5.0,
        decision_log_size=16,
        key_digester=DIGESTER,
    )
    return PoolRuntime(state, clock=clock, reconcile_min_interval_s=0.0)


async def _keeper(
    store: SqliteStateStore, file: PoolConfig, clock: ManualClock
) -> tuple[StateKeeper, PoolRuntime]:
    runtime = _runtime(file, clock)
    keeper = StateKeeper(
        store,
        StateStoreConfig(decision_keyframe_every_count=3),
        file_pools={"p": file},
        runtimes={"p": runtime},
        clock=clock,
        decision_log_size=16,
        key_digester=DIGESTER,
    )
    await store.open()
    await keeper.restore()
    return keeper, runtime


async def test_a_second_run_continues_where_the_first_stopped(tmp_path: Path) -> None:
    clock = ManualClock()
    path = str(tmp_path / "state.sqlite3")
    keeper, runtime = await _keeper(SqliteStateStore(path), FILE, clock)
    added = Override(
        pool="p",
        config_version=2,
        kind="add_tenant",
        tenant="C",
        settings={"floor_slots": 2},
        key_digests=(DIGESTER.digest("key-c"),),
        key_scheme=DIGESTER.scheme,
        file_fields=file_fields_of(FILE, "add_tenant", tenant="C", digester=DIGESTER),
    )
    await keeper.record_change(added)
    runtime.change_config(*_applied(runtime, added))
    for _ in range(4):
        runtime.loop.decide_once()
    published = runtime.state.allocation.version
    last_id = runtime.state.decisions.newest(1)[0].id
    await keeper.close()

    again, restored = await _keeper(SqliteStateStore(path), FILE, clock)
    try:
        state = restored.state
        assert [t.name for t in state.pool.tenants] == ["A", "B", "C"]
        assert state.key_digests["C"] == (DIGESTER.digest("key-c"),)
        assert state.config_version == 2
        record = restored.loop.decide_once()
        assert record.id == last_id + 1
        assert state.allocation.version > published
        history = await again.history(
            "p", HistoryQuery(limit=100, since_version=1), changes_only=False
        )
        assert [r.id for r in history] == list(range(1, last_id + 2))
        assert history[0].trigger == "config v2: added tenant C"
    finally:
        await again.close()


def _applied(
    runtime: PoolRuntime, change: Override
) -> tuple[PoolConfig, dict[str, tuple[bytes, ...]], str]:
    return apply(runtime.state.pool, runtime.state.key_digests, change)


async def test_a_change_the_file_overtook_is_dropped_and_marked(tmp_path: Path) -> None:
    clock = ManualClock()
    path = str(tmp_path / "state.sqlite3")
    keeper, _ = await _keeper(SqliteStateStore(path), FILE, clock)
    await keeper.record_change(
        Override(
            pool="p",
            config_version=2,
            kind="update_tenant",
            tenant="A",
            settings={"floor_slots": 6},
            file_fields=file_fields_of(
                FILE, "update_tenant", tenant="A", settings=["floor_slots"], digester=DIGESTER
            ),
        )
    )
    await keeper.close()
    edited = FILE.model_copy(
        update={"tenants": [FILE.tenants[0].model_copy(update={"floor_slots": 5}), FILE.tenants[1]]}
    )
    again, runtime = await _keeper(SqliteStateStore(path), edited, clock)
    try:
        assert runtime.state.pool.tenants[0].floor_slots == 5, "the file wins"
        assert runtime.state.config_version == 2, "versions keep growing"
        (stored,) = await again.store.changes("p")
        assert stored.dropped_reason == (
            "the config file changed tenants/A/floor_slots (was 4, now 5)"
        )
    finally:
        await again.close()


async def test_decisions_wait_for_a_store_that_is_down_then_go_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="controlplane.state_keeper")
    clock = ManualClock()
    store = FlakyStore(str(tmp_path / "state.sqlite3"))
    keeper, runtime = await _keeper(store, FILE, clock)
    try:
        store.down = True
        for _ in range(3):
            runtime.loop.decide_once()
        await keeper.flush()
        runtime.loop.decide_once()
        runtime.loop.decide_once()
        await keeper.flush()
        assert await store.decisions("p", HistoryQuery(limit=100)) == []
        errors = [r for r in caplog.records if "cannot write decisions" in r.getMessage()]
        assert len(errors) == 1, "logged once while the store stays down"
        store.down = False
        await keeper.flush()
        entries = await store.decisions("p", HistoryQuery(limit=100))
        assert [e.record.id for e in entries] == [1, 2, 3, 4, 5]
        assert [e.keyframe for e in entries] == [True, False, False, True, False]
        assert "decisions are written again" in caplog.text
    finally:
        await keeper.close()


async def test_the_version_ceiling_stays_ahead_of_what_is_published(tmp_path: Path) -> None:
    clock = ManualClock()
    store = SqliteStateStore(str(tmp_path / "state.sqlite3"))
    keeper, runtime = await _keeper(store, FILE, clock)
    try:
        assert (await store.counters("p")).allocation_version == VERSION_LEASE
        await keeper.check_versions()
        assert (await store.counters("p")).allocation_version == VERSION_LEASE, "far ahead still"
        runtime.continue_versions_above(VERSION_LEASE // 2 + 10)
        runtime.state.reconcile(force_publish=True)
        published = runtime.state.allocation.version
        await keeper.check_versions()
        assert (await store.counters("p")).allocation_version == published + VERSION_LEASE
    finally:
        await keeper.close()


async def _keeper_of(
    path: str, clock: ManualClock, *, drop_stale: bool = False
) -> tuple[StateKeeper, PoolRuntime]:
    runtime = _runtime(FILE, clock)
    keeper = StateKeeper(
        SqliteStateStore(path),
        StateStoreConfig(),
        file_pools={"p": FILE},
        runtimes={"p": runtime},
        clock=clock,
        decision_log_size=16,
        key_digester=DIGESTER,
        drop_stale=drop_stale,
    )
    await keeper.store.open()
    return keeper, runtime


async def test_key_changes_are_stored_and_replayed_over_a_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    path = str(tmp_path / "state.sqlite3")
    keeper, runtime = await _keeper(SqliteStateStore(path), FILE, clock)
    fields = file_fields_of(FILE, "add_key", tenant="A", digester=DIGESTER)
    changes = [
        Override(
            pool="p",
            config_version=2,
            kind="add_key",
            tenant="A",
            key_digests=(DIGESTER.digest("key-a-2"),),
            key_scheme=DIGESTER.scheme,
            file_fields=fields,
        ),
        Override(
            pool="p",
            config_version=3,
            kind="revoke_key",
            tenant="A",
            key_digests=(DIGESTER.digest("key-a"),),
            key_scheme=DIGESTER.scheme,
            file_fields=fields,
        ),
    ]
    for change in changes:
        await keeper.record_change(change)
        _, digests, what = _applied(runtime, change)
        runtime.change_keys(digests, what)
    assert runtime.state.key_digests["A"] == (DIGESTER.digest("key-a-2"),)
    await keeper.close()

    again, restored = await _keeper(SqliteStateStore(path), FILE, clock)
    try:
        assert restored.state.key_digests["A"] == (DIGESTER.digest("key-a-2"),)
        assert restored.state.key_digests["B"] == (DIGESTER.digest("key-b"),)
        assert restored.state.config_version == 3
    finally:
        await again.close()


async def test_changes_of_another_key_scheme_stop_the_start_unless_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Changes stored before keyed digests hold unkeyed ones: a keyed control plane refuses
    to start rather than silently stop authenticating them; told to, it drops them. A legacy
    change without a digest of its own still applies."""
    clock = ManualClock()
    path = str(tmp_path / "state.sqlite3")
    unkeyed = KeyDigester.unkeyed()
    store = SqliteStateStore(path)
    await store.open()
    await store.add_change(
        Override(
            pool="p",
            config_version=2,
            kind="add_tenant",
            tenant="C",
            settings={"floor_slots": 2},
            key_digests=(unkeyed.digest("key-c"),),
            file_fields=file_fields_of(FILE, "add_tenant", tenant="C", digester=unkeyed),
        )
    )
    await store.add_change(
        Override(
            pool="p",
            config_version=3,
            kind="remove_tenant",
            tenant="B",
            file_fields=file_fields_of(FILE, "remove_tenant", tenant="B", digester=unkeyed),
        )
    )
    await store.close()

    keeper, runtime = await _keeper_of(path, clock)
    with caplog.at_level(logging.ERROR), pytest.raises(StaleKeyDigests, match="drop_stale"):
        await keeper.restore()
    assert "v2 (add_tenant C) holds key digests of scheme sha256" in caplog.text
    assert [t.name for t in runtime.state.pool.tenants] == ["A", "B"]  # nothing restored
    await keeper.close()

    keeper, runtime = await _keeper_of(path, clock, drop_stale=True)
    try:
        await keeper.restore()
        assert [t.name for t in runtime.state.pool.tenants] == ["A"]  # B's removal applied
        changes = await keeper.store.changes("p")
        assert [c.dropped_reason is not None for c in changes] == [True, False]
    finally:
        await keeper.close()


async def test_gateways_are_stored_during_the_restart_hold_without_dropping_the_awaited(
    tmp_path: Path,
) -> None:
    # A gateway that connects while the hold waits for another must be stored at once: a
    # control plane restarted then would otherwise end its hold when the awaited one alone came
    # back, and grant it what the unknown one still holds.
    clock = ManualClock()
    path = str(tmp_path / "state.sqlite3")
    store = SqliteStateStore(path)
    await store.open()
    await store.set_gateways("p", ["gw-a"])
    await store.close()
    keeper, runtime = await _keeper(SqliteStateStore(path), FILE, clock)
    try:
        assert runtime.state.holding
        runtime.state.connect_gateway("gw-b", 0, [])
        await keeper.store_gateways()
        assert await keeper.store.gateways("p") == ["gw-a", "gw-b"]
        # Once the hold is over, the stored gateways are those the pool counts.
        clock.advance(2.0)
        runtime.state.expire_leases()
        assert not runtime.state.holding
        await keeper.store_gateways()
        assert await keeper.store.gateways("p") == ["gw-b"]
    finally:
        await keeper.close()
