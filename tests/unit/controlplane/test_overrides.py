"""controlplane/core/overrides.py: admin changes replayed on top of the config file; the file
wins over a change whose fields it changed since, and a change that no longer applies is left
out, each with its reason."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.overrides import Override, OverrideKind, file_fields_of, replay
from slotshift.config import PoolConfig, TenantConfig
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


def _override(version: int, kind: OverrideKind, file: PoolConfig = FILE, **fields: Any) -> Override:
    """A change as the admin API stores it: with what `file` said of the fields it touches."""
    return Override(
        pool="p",
        config_version=version,
        kind=kind,
        file_fields=file_fields_of(
            file,
            kind,
            tenant=fields.get("tenant", ""),
            settings=fields.get("settings", {}),
            clear=fields.get("clear", ()),
            digester=DIGESTER,
        ),
        key_scheme=DIGESTER.scheme,
        **fields,
    )


CHANGES = [
    _override(
        2,
        "add_tenant",
        tenant="C",
        settings={"floor_slots": 2},
        key_digests=(DIGESTER.digest("key-c"),),
    ),
    _override(3, "update_tenant", tenant="A", settings={"floor_slots": 6}),
    _override(4, "update_tenant", tenant="C", settings={"weight": 3.0}),
    _override(5, "set_policy", policy="slo"),
    _override(6, "remove_tenant", tenant="B"),
]


def _file(**changes: Any) -> PoolConfig:
    """FILE with pool fields, or (`A`, `B`, `C`: a dict, None to remove) tenants, changed."""
    data = FILE.model_dump(mode="python")
    for tenant in FILE.tenants:
        data["tenants"][[t.name for t in FILE.tenants].index(tenant.name)]["api_keys"] = [
            f"key-{tenant.name.lower()}"
        ]
    tenants = {t["name"]: t for t in data["tenants"]}
    for name, value in changes.items():
        if name in ("A", "B", "C"):
            if value is None:
                tenants.pop(name)
            else:
                tenants[name] = {**tenants.get(name, {"name": name}), **value}
        else:
            data[name] = value
    data["tenants"] = list(tenants.values())
    return PoolConfig.model_validate(data)


def test_an_unchanged_file_replays_every_change_in_version_order() -> None:
    result = replay(FILE, list(reversed(CHANGES)), DIGESTER)
    assert result.dropped == ()
    assert [o.config_version for o in result.applied] == [2, 3, 4, 5, 6]
    tenants = {t.name: t for t in result.pool.tenants}
    assert set(tenants) == {"A", "C"}
    assert (tenants["A"].floor_slots, tenants["C"].weight) == (6, 3.0)
    assert result.pool.policy == "slo"
    assert result.key_digests == {
        "A": (DIGESTER.digest("key-a"),),
        "C": (DIGESTER.digest("key-c"),),
    }


@pytest.mark.parametrize(
    ("file", "dropped", "reason"),
    [
        pytest.param(
            _file(A={"floor_slots": 5}),
            {3},
            "the config file changed tenants/A/floor_slots (was 4, now 5)",
            id="a-setting-changed-in-the-file",
        ),
        pytest.param(
            _file(policy="static"),
            {5},
            'the config file changed policy (was "demand", now "static")',
            id="the-policy-changed-in-the-file",
        ),
        pytest.param(
            _file(C={"floor_slots": 1, "api_keys": ["key-c2"]}),
            {2, 4},
            "the config file changed tenants/C (was absent, now",
            id="the-file-now-has-the-added-tenant",
        ),
        pytest.param(
            _file(B={"weight": 2.0}),
            {6},
            "the config file changed tenants/B (was",
            id="the-removed-tenant-changed-in-the-file",
        ),
        pytest.param(
            _file(budget_slots=10),
            {3},
            "no longer applies: tenant.floor_slots",
            id="floors-above-a-lowered-budget",
        ),
        pytest.param(
            _file(A={"api_keys": ["key-a", "key-c"]}),
            {2, 4},
            "no longer applies: tenant.api_keys: a key already identifies another tenant",
            id="a-file-tenant-holds-the-added-key",
        ),
    ],
)
def test_the_file_wins_and_what_no_longer_applies_is_dropped(
    file: PoolConfig, dropped: set[int], reason: str
) -> None:
    result = replay(file, CHANGES, DIGESTER)
    assert {d.override.config_version for d in result.dropped} == dropped
    first = min(result.dropped, key=lambda d: d.override.config_version)
    assert first.reason.startswith(reason), first.reason
    assert {o.config_version for o in result.applied} == {2, 3, 4, 5, 6} - dropped
    # Whatever was dropped, the result is a valid pool of the file's name and budget.
    assert result.pool.budget_slots == file.budget_slots
    assert set(result.key_digests) == {t.name for t in result.pool.tenants}


def test_a_change_of_another_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="replayed on"):
        replay(
            FILE,
            [Override(pool="q", config_version=2, kind="set_policy", policy="slo")],
            DIGESTER,
        )
