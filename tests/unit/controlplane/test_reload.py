"""controlplane/core/reload.py: what a reloaded config file may change live, what it changes of a
pool in words, and per pool what runs after it: the stored admin changes replayed on the new
file, the file winning over a change whose fields it changed."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.config_change import config_key_digests
from controlplane.core.overrides import Override, OverrideKind, file_fields_of, replay
from controlplane.core.reload import plan_pool, pool_changes, restart_needed
from slotshift.config import PoolConfig, SlotshiftConfig, apply_overrides
from slotshift.keys import KeyDigester

DIGESTER = KeyDigester.keyed("test-key-digest-secret-of-32-bytes")

FILE_DATA: dict[str, Any] = {
    "name": "p",
    "budget_slots": 20,
    "tenants": [
        {"name": "A", "floor_slots": 4, "api_keys": ["key-a"]},
        {"name": "B", "floor_slots": 4, "api_keys": ["key-b"]},
    ],
}
FILE = PoolConfig.model_validate(FILE_DATA)


def _file(**tenants: dict[str, Any] | None) -> PoolConfig:
    """FILE with tenants changed (a dict of settings), added, or removed (None)."""
    by_name = {t["name"]: dict(t) for t in FILE_DATA["tenants"]}
    for name, settings in tenants.items():
        if settings is None:
            by_name.pop(name)
        else:
            by_name[name] = {**by_name.get(name, {"name": name}), **settings}
    return PoolConfig.model_validate({**FILE_DATA, "tenants": list(by_name.values())})


def _override(version: int, kind: OverrideKind, **fields: Any) -> Override:
    """A change as the admin API stores it on top of FILE."""
    return Override(
        pool="p",
        config_version=version,
        kind=kind,
        file_fields=file_fields_of(
            FILE,
            kind,
            tenant=fields.get("tenant", ""),
            settings=fields.get("settings", {}),
            digester=DIGESTER,
        ),
        key_scheme=DIGESTER.scheme,
        **fields,
    )


RAISE_A = _override(2, "update_tenant", tenant="A", settings={"floor_slots": 6})
ADD_C = _override(
    3, "add_tenant", tenant="C", settings={"floor_slots": 2}, key_digests=(DIGESTER.digest("k-c"),)
)


def _plan(after: PoolConfig, stored: list[Override]) -> Any:
    """The plan for a pool running FILE with `stored` on top, its file becoming `after`."""
    running = replay(FILE, stored, DIGESTER)
    return plan_pool(
        running=running.pool,
        running_digests=running.key_digests,
        file_before=FILE,
        file_after=after,
        stored=stored,
        digester=DIGESTER,
    )


def test_an_unchanged_file_touches_nothing_even_with_stored_changes() -> None:
    plan = _plan(_file(), [RAISE_A, ADD_C])
    assert plan.action == "none"
    assert plan.file_changes == ()
    assert plan.dropped == ()
    assert {t.name for t in plan.pool.tenants} == {"A", "B", "C"}


def test_a_changed_weight_is_applied_and_the_stored_changes_kept() -> None:
    plan = _plan(_file(B={"weight": 3.0}), [RAISE_A, ADD_C])
    assert plan.action == "config"
    assert plan.file_changes == ("tenant B: weight 1.0 -> 3.0",)
    tenants = {t.name: t for t in plan.pool.tenants}
    assert tenants["B"].weight == 3.0
    assert tenants["A"].floor_slots == 6, "the stored change on A still applies"
    assert "C" in tenants and plan.key_digests["C"] == (DIGESTER.digest("k-c"),)
    assert plan.dropped == ()


def test_the_file_wins_over_a_stored_change_of_the_field_it_changed() -> None:
    plan = _plan(_file(A={"floor_slots": 5}), [RAISE_A, ADD_C])
    assert plan.action == "config"
    assert [d.override.config_version for d in plan.dropped] == [2]
    assert "tenants/A/floor_slots (was 4, now 5)" in plan.dropped[0].reason
    assert {t.name: t.floor_slots for t in plan.pool.tenants}["A"] == 5


def test_a_tenant_added_in_the_file_runs_with_its_keys() -> None:
    plan = _plan(_file(D={"floor_slots": 1, "api_keys": ["key-d"]}), [])
    assert plan.action == "config"
    assert plan.file_changes == ("tenant D added",)
    assert plan.key_digests["D"] == (DIGESTER.digest("key-d"),)


def test_a_file_that_catches_up_with_a_stored_change_changes_nothing_that_runs() -> None:
    # The file now says what the admin change said: the change is dropped (the file's field
    # moved), and what runs is the same, so no new version.
    plan = _plan(_file(A={"floor_slots": 6}), [RAISE_A])
    assert plan.action == "none"
    assert plan.file_changes == ("tenant A: floor_slots 4 -> 6",)
    assert [d.override.config_version for d in plan.dropped] == [2]


def test_a_key_change_alone_is_a_key_change_never_shown() -> None:
    plan = _plan(_file(A={"api_keys": ["key-a", "key-a2"]}), [])
    assert plan.action == "keys"
    assert plan.file_changes == ("tenant A: keys",)
    assert plan.key_digests["A"] == (DIGESTER.digest("key-a"), DIGESTER.digest("key-a2"))
    assert all("key-a2" not in change for change in plan.file_changes)


def test_a_removed_tenant_is_removed() -> None:
    plan = _plan(_file(B=None), [])
    assert plan.action == "config"
    assert plan.file_changes == ("tenant B removed",)
    assert [t.name for t in plan.pool.tenants] == ["A"]
    assert plan.key_digests == {"A": (DIGESTER.digest("key-a"),)}


def test_pool_fields_are_named_with_their_values() -> None:
    after = PoolConfig.model_validate({**FILE_DATA, "budget_slots": 24, "policy": "slo"})
    assert pool_changes(FILE, after) == ["budget_slots 20 -> 24", "policy demand -> slo"]
    assert pool_changes(FILE, FILE) == []


def test_the_running_keys_are_what_the_plan_compares() -> None:
    # A pool whose digests in memory differ from the file's (say, an admin AddKey stored) and
    # a file that changes something else: the stored key change is replayed, not lost.
    add_key = _override(2, "add_key", tenant="A", key_digests=(DIGESTER.digest("key-a9"),))
    plan = _plan(_file(B={"weight": 2.0}), [add_key])
    assert plan.key_digests["A"] == (DIGESTER.digest("key-a"), DIGESTER.digest("key-a9"))
    assert config_key_digests(FILE, DIGESTER)["A"] != plan.key_digests["A"]


def _whole(**overrides: Any) -> SlotshiftConfig:
    config = SlotshiftConfig.model_validate(
        {"pools": [FILE_DATA], "tenant_keys": {"unkeyed_key_digests": True}}
    )
    return apply_overrides(config, overrides) if overrides else config


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param({}, [], id="same"),
        pytest.param({"pools.0.budget_slots": 30}, [], id="a-pool-field-reloads"),
        pytest.param({"gateway.port": 9999}, [], id="another-service-section-is-not-ours"),
        pytest.param({"controlplane.grpc_port": 1234}, ["controlplane.grpc_port"], id="port"),
        pytest.param(
            {"controlplane.state_store.kind": "memory"}, ["controlplane.state_store"], id="store"
        ),
        pytest.param(
            {"controlplane.config_reload_interval_s": 0},
            ["controlplane.config_reload_interval_s"],
            id="the-watch-itself",
        ),
        pytest.param(
            {"tenant_keys.unkeyed_key_digests": False, "tenant_keys.key_digest_secret": "x" * 32},
            ["tenant_keys.key_digest_secret", "tenant_keys.unkeyed_key_digests"],
            id="key-digest-secret",
        ),
        pytest.param({"pools.0.name": "q"}, ["pools: pool q added", "pools: pool p removed"]),
    ],
)
def test_what_needs_a_restart(overrides: dict[str, Any], expected: list[str]) -> None:
    assert restart_needed(_whole(), _whole(**overrides)) == expected
