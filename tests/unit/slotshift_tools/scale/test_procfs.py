"""Reading CPU time and memory from /proc (a fake one here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slotshift_tools.scale import procfs

TICKS = os.sysconf("SC_CLK_TCK")


def test_cpu_time_is_user_plus_system_whatever_the_command_name(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    fields = ["S", *["0"] * 10, str(3 * TICKS), str(TICKS), *["0"] * 30]
    (tmp_path / "42" / "stat").write_text(f"42 (python -m x) y) {' '.join(fields)}\n")
    assert procfs.process_cpu_s(42, tmp_path) == pytest.approx(4.0)


def test_memory_is_vmrss_and_vmhwm_in_mib(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text(
        "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n"
    )
    assert procfs.process_memory(7, tmp_path) == procfs.Memory(rss_mb=100.0, peak_rss_mb=200.0)


def test_host_busy_time_leaves_out_idle_and_iowait(tmp_path: Path) -> None:
    ticks = [10, 0, 5, 80, 5, 0, 0, 0, 0, 0]
    (tmp_path / "stat").write_text("cpu  " + " ".join(str(t * TICKS) for t in ticks) + "\ncpu0 1\n")
    host = procfs.host_cpu(tmp_path)
    assert host.busy_s == pytest.approx(15.0)
    assert host.total_s == pytest.approx(100.0)


def test_this_process_has_spent_some_cpu() -> None:
    assert procfs.process_cpu_s(os.getpid()) > 0
    assert procfs.process_memory(os.getpid()).rss_mb > 1


def test_cores_used_over_a_window() -> None:
    assert procfs.cores_used(10.0, 25.0, 10.0) == 1.5
    assert procfs.cores_used(1.0, 2.0, 0.0) == 0.0
