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
from slotshift_tools.cli import main
from slotshift_tools.state_command import run_state


def _config(tmp_path: Path) -> SlotshiftConfig:
    path = tmp_path / "slotshift.yaml"
    path.write_text(
        """
pools:
  - name: default
    budget_slots: 10
    tenants:
      - {name: A, api_keys: [key-a]}
tenant_keys: {key_digest_secret: slotshift-tests-key-digest-secret-0123456789abcdef}
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
    assert lines[1].startswith("pool default: config v3, allocation versions below 0")
    assert lines[2] == (
        "  v2 add_tenant tenant C: floor_slots=2, 1 key(s) (stored 2023-11-14 22:13:20 UTC)"
    )
    assert lines[3].endswith("DROPPED: the config file changed policy")
    reset = io.StringIO()
    assert run_state(config, "reset", pool="default", out=reset) == 0
    assert reset.getvalue() == "deleted 2 stored admin changes of pool default\n"
    shown = io.StringIO()
    run_state(config, "show", pool="default", out=shown)
    assert "no stored admin changes: the config file as it is" in shown.getvalue()
    assert "config v3" in shown.getvalue(), "the counters stay"


def test_the_command_line_names_an_unknown_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _config(tmp_path)
    code = main(["state", "show", "--config", str(tmp_path / "slotshift.yaml"), "--pool", "nope"])
    assert code == 2
    assert "no pool 'nope'" in capsys.readouterr().err
