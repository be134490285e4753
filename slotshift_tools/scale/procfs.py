"""CPU time and memory of processes, and the host's busy CPU time, read from /proc (Linux).

No dependency: psutil is not one of the project's. CPU time counts every thread of a process
(user plus system); 1.0 core over a window means one core busy the whole window.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """User plus system CPU seconds of process `pid` so far; OSError when it is gone."""
    text = (proc / str(pid) / "stat").read_text()
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rindex(")") + 2 :].split()
    # utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@dataclass(frozen=True)
class Memory:
    """Resident memory of a process, MiB."""

    rss_mb: float
    peak_rss_mb: float
    """VmHWM: the most it was resident at once since it started."""


def process_memory(pid: int, proc: Path = Path("/proc")) -> Memory:
    """VmRSS and VmHWM of `pid`; OSError when it is gone."""
    values: dict[str, float] = {}
    for line in (proc / str(pid) / "status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024.0
    return Memory(rss_mb=values.get("VmRSS", 0.0), peak_rss_mb=values.get("VmHWM", 0.0))


@dataclass(frozen=True)
class HostCpu:
    """The host's CPU time so far, seconds summed over its CPUs."""

    busy_s: float
    total_s: float


def host_cpu(proc: Path = Path("/proc")) -> HostCpu:
    """From the first line of /proc/stat; busy is everything but idle and iowait."""
    first = (proc / "stat").read_text().splitlines()[0].split()
    ticks = [int(x) for x in first[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    total = sum(ticks[:8])  # guest time is already counted in user
    return HostCpu(busy_s=(total - idle) / _CLOCK_TICKS, total_s=total / _CLOCK_TICKS)


def cores_used(cpu_before_s: float, cpu_after_s: float, seconds: float) -> float:
    """CPU seconds over a window's length: 1.0 is one core busy throughout."""
    return (cpu_after_s - cpu_before_s) / seconds if seconds > 0 else 0.0
