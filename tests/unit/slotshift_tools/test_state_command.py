"""`slotshift state show|reset` (slotshift_tools/state_command.py) on a real SQLite store beside
a config file."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from controlplane.core.overrides import Override
from controlplane.store.sqlite import SqliteStateStore
from slotshift.config import SlotshiftConfig, load_config
from slotshift.keys import UNKEYED_SCHEME, KeyDigester
from slotshift_tools.cli import main
from slotshift_tools.state_command import run_state

SECRET = "slotshift-tests-key-digest-secret-0123456789abcdef"
KEYED_SCHEME = KeyDigester.keyed(SECRET).scheme


def _config(tmp_path: Path, *, drop_stale: bool = False) -> SlotshiftConfig:
    path = tmp_path / "slotshift.yaml"
    path.write_text(
        f"""
pools:
  - name: default
    budget_slots: 10
    tenants:
      - {{name: A, api_keys: [key-a]}}
tenant_keys:
  key_digest_secret: {SECRET}
  drop_stale_key_changes: {str(drop_stale).lower()}
"""
    )
    return load_config(path)


async def _store_changes(path: str) -> None:
    store = SqliteStateStore(path)
    await store.open()
    try:
        await store.add_change(
            Override(
                pool="default",
                config_version=2,
                kind="add_tenant",
                tenant="C",
                settings={"floor_slots": 2},
                key_digests=(b"\x00" * 32,),
                stored_at_wall_s=1.7e9,
            )
        )
        await store.add_change(
            Override(pool="default", config_version=3, kind="set_policy", policy="slo")
        )
        await store.drop_change("default", 3, reason="the config file changed policy")
        # A key added under this config's secret: of its scheme, not stale.
        await store.add_change(
            Override(
                pool="default",
                config_version=4,
                kind="add_key",
                tenant="A",
                key_digests=(KeyDigester.keyed(SECRET).digest("key-a2"),),
                key_scheme=KEYED_SCHEME,
                stored_at_wall_s=1.7e9,
            )
        )
    finally:
        await store.close()


def test_show_lists_the_changes_and_reset_deletes_them(tmp_path: Path) -> None:
    config = _config(tmp_path)
    sqlite_file = config.controlplane.state_store.sqlite_file
    assert sqlite_file == str(tmp_path / "slotshift-state.sqlite3"), "beside the config file"
    asyncio.run(_store_changes(sqlite_file))
    shown = io.StringIO()
    assert run_state(config, "show", pool=None, out=shown) == 0
    lines = shown.getvalue().splitlines()
    assert lines[0] == f"state store: sqlite {sqlite_file}"
    assert lines[1] == f"key digests of this config: {KEYED_SCHEME}"
    assert lines[2].startswith("pool default: config v4, allocation versions below 0")
    # Stored before keyed digests (an Override's default scheme): unkeyed, and stale now.
    assert lines[3] == (
        f"  v2 add_tenant tenant C: floor_slots=2, 1 key(s) (key scheme {UNKEYED_SCHEME}, "
        "stored 2023-11-14 22:13:20 UTC) STALE: its key digests are not of this config's "
        f"scheme {KEYED_SCHEME}: the next start refuses to run (start with the secret it was "
        "made under, or set tenant_keys.drop_stale_key_changes to drop it)"
    )
    assert lines[4].startswith(f"  v3 set_policy policy slo (key scheme {UNKEYED_SCHEME}, ")
    assert lines[4].endswith("DROPPED: the config file changed policy")
    assert lines[5] == (
        f"  v4 add_key tenant A: 1 key(s) (key scheme {KEYED_SCHEME}, "
        "stored 2023-11-14 22:13:20 UTC)"
    )
    assert len(lines) == 6
    reset = io.StringIO()
    assert run_state(config, "reset", pool="default", out=reset) == 0
    assert reset.getvalue() == "deleted 3 stored admin changes of pool default\n"
    shown = io.StringIO()
    run_state(config, "show", pool="default", out=shown)
    assert "no stored admin changes: the config file as it is" in shown.getvalue()
    assert "config v4" in shown.getvalue(), "the counters stay"


def test_show_says_a_stale_change_is_dropped_where_the_config_drops_them(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, drop_stale=True)
    sqlite_file = config.controlplane.state_store.sqlite_file
    assert sqlite_file is not None
    asyncio.run(_store_changes(sqlite_file))
    shown = io.StringIO()
    assert run_state(config, "show", pool="default", out=shown) == 0
    stale = [line for line in shown.getvalue().splitlines() if "STALE" in line]
    assert len(stale) == 1
    assert stale[0].startswith("  v2 add_tenant")
    assert stale[0].endswith("the next start drops it (tenant_keys.drop_stale_key_changes)")


def test_the_command_line_names_an_unknown_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _config(tmp_path)
    code = main(["state", "show", "--config", str(tmp_path / "slotshift.yaml"), "--pool", "nope"])
    assert code == 2
    assert "no pool 'nope'" in capsys.readouterr().err
