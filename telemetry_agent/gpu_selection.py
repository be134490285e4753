"""Which GPUs are one engine's: its config's choice resolved against each NVML reading.

An agent that watches several engines reads every GPU once per reading (gpu.py) and gives each
engine only the devices its config names (by NVML index or UUID, listed or in a file), so that a
report carries its own engine's GPUs and no figure of another pool's. A GPU that the config names
but NVML does not show makes the engine's GPU figures missing, with the reason, rather than
reporting some of them: a partial set would read as a lighter load.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from slotshift.config import AgentEngineConfig, GpuSelector
from telemetry_agent.gpu import GpuReading

logger = logging.getLogger(__name__)

_UUID = re.compile(r"^GPU-[0-9A-Fa-f-]{8,}$")


class GpusFileError(Exception):
    """A gpus_file that cannot be read or names something that is not a GPU; the message says
    which and why."""


def parse_gpus_file(text: str) -> list[GpuSelector]:
    """The GPUs a gpus_file names: indices and UUIDs, one per line or comma-separated (as
    NVIDIA_VISIBLE_DEVICES lists them), blank lines and `#` comments skipped, in file order.
    GpusFileError names the first entry that is neither."""
    selectors: list[GpuSelector] = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0]
        for entry in (part.strip() for part in content.split(",")):
            if not entry:
                continue
            if entry.isdigit():
                selectors.append(int(entry))
            elif _UUID.match(entry):
                selectors.append(entry)
            else:
                raise GpusFileError(f"line {number}: {entry!r} is neither a GPU index nor a UUID")
    return selectors


def select_devices(reading: GpuReading, wanted: Sequence[GpuSelector] | None) -> GpuReading:
    """The part of `reading` that is the engine's: every device when `wanted` is None, else the
    devices it names (an int by index, a UUID in any case), in index order. Unavailable when the
    reading is, when `wanted` is empty, or when a GPU it names is not in the reading (the reason
    lists what NVML shows)."""
    if not reading.available or wanted is None:
        return reading
    if not wanted:
        return GpuReading(devices=(), unavailable_reason="no GPU is configured for this engine")
    by_index = {device.index: device for device in reading.devices}
    by_uuid = {device.uuid.lower(): device for device in reading.devices}
    chosen = {}
    missing: list[GpuSelector] = []
    for selector in wanted:
        device = (
            by_index.get(selector) if isinstance(selector, int) else by_uuid.get(selector.lower())
        )
        if device is None:
            missing.append(selector)
        else:
            chosen[device.index] = device
    if missing:
        shown = ", ".join(f"{d.index}:{d.uuid}" for d in reading.devices)
        return GpuReading(
            devices=(),
            unavailable_reason=f"GPU(s) {missing} of this engine not found; NVML shows {shown}",
        )
    return GpuReading(devices=tuple(chosen[i] for i in sorted(chosen)), unavailable_reason="")


class EngineGpus:
    """One engine's GPUs: `select` takes a reading of every GPU and returns the engine's part.

    With a gpus_file, the file is read (in a worker thread) at every selection, so that a file
    written after the agent started, or rewritten when the engine moved, is followed. Each new
    reason for missing figures is logged once, not every interval.
    """

    def __init__(self, engine: AgentEngineConfig) -> None:
        self._pool = engine.pool
        self._listed = engine.gpus
        self._file = Path(engine.gpus_file) if engine.gpus_file is not None else None
        self._last_reason: str | None = None

    @property
    def described(self) -> str:
        """How the engine's GPUs are chosen, for the agent's ready line and /health."""
        if self._file is not None:
            return f"gpus_file {self._file}"
        if self._listed is None:
            return "every GPU"
        return f"gpus {self._listed}"

    async def select(self, reading: GpuReading) -> GpuReading:
        """The engine's part of `reading` (see select_devices), or why it has none."""
        if self._file is None or not reading.available:
            selected = select_devices(reading, self._listed)
        else:
            try:
                wanted = await asyncio.to_thread(_read_gpus_file, self._file)
            except GpusFileError as exc:
                selected = GpuReading(devices=(), unavailable_reason=f"gpus_file {exc}")
            else:
                selected = select_devices(reading, wanted)
        self._log_change(reading, selected)
        return selected

    def _log_change(self, reading: GpuReading, selected: GpuReading) -> None:
        # NVML's own failures are the monitor's to log; only this engine's selection is ours.
        reason = selected.unavailable_reason if reading.available else ""
        if reason == self._last_reason:
            return
        if reason:
            logger.warning("pool %s: no GPU figures: %s", self._pool, reason)
        elif selected.devices:
            logger.info(
                "pool %s: GPU(s) %s",
                self._pool,
                ", ".join(f"{d.index}:{d.uuid}" for d in selected.devices),
            )
        self._last_reason = reason


def _read_gpus_file(path: Path) -> list[GpuSelector]:
    """Blocking: the GPUs `path` names; GpusFileError when it is missing, unreadable, malformed
    or names none yet."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise GpusFileError(f"{path} is not written yet") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise GpusFileError(f"{path}: {exc}") from exc
    try:
        selectors = parse_gpus_file(text)
    except GpusFileError as exc:
        raise GpusFileError(f"{path}: {exc}") from exc
    if not selectors:
        raise GpusFileError(f"{path} names no GPU yet")
    return selectors
