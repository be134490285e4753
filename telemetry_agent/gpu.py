"""GPU readings through NVML, behind a small interface so tests can stand in for the driver.

A GpuReader makes blocking calls (NVML talks to the driver); GpuMonitor is the only caller and
runs every one of them in a worker thread. Where NVML cannot be used (no driver, no library, no
GPU), the monitor says why and returns no figures; it logs each new reason once, not every
interval, and tries again at each reading so that a driver loaded later is picked up.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

import pynvml

logger = logging.getLogger(__name__)


class GpuReadError(Exception):
    """NVML (or whatever stands in for it) could not give a reading; the message says why."""


@dataclass(frozen=True)
class GpuDeviceReading:
    """One GPU as NVML sees it at one moment."""

    index: int
    uuid: str
    name: str
    utilization_pct: float
    """Percent of the last sample period in which a kernel ran (nvmlDeviceGetUtilizationRates)."""
    memory_used_bytes: int
    memory_total_bytes: int


class GpuReader(Protocol):
    """Blocking access to the GPUs. Every method may block; only GpuReadError may escape."""

    def open(self) -> None:
        """Get ready to read (nvmlInit); may be called again after a failure."""
        ...

    def read_devices(self) -> list[GpuDeviceReading]:
        """Read every GPU, in index order."""
        ...

    def close(self) -> None:
        """Release what open() took (nvmlShutdown)."""
        ...


class PynvmlReader:
    """The real GpuReader: NVML through pynvml (package nvidia-ml-py)."""

    def open(self) -> None:
        """Initialise NVML; GpuReadError when the library or driver is missing."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"NVML initialisation failed: {exc}") from exc

    def read_devices(self) -> list[GpuDeviceReading]:
        """Index, UUID, name, utilisation and memory of every GPU."""
        try:
            devices = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                devices.append(
                    GpuDeviceReading(
                        index=index,
                        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                        name=_text(pynvml.nvmlDeviceGetName(handle)),
                        utilization_pct=float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                        memory_used_bytes=int(memory.used),
                        memory_total_bytes=int(memory.total),
                    )
                )
            return devices
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"NVML read failed: {exc}") from exc

    def close(self) -> None:
        """Shut NVML down."""
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"NVML shutdown failed: {exc}") from exc


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class GpuReading:
    """What one reading found: the GPUs, or why there are none."""

    devices: tuple[GpuDeviceReading, ...]
    unavailable_reason: str
    """Empty when devices were read; otherwise why none could be."""

    @property
    def available(self) -> bool:
        return not self.unavailable_reason


class GpuMonitor:
    """Reads the GPUs through a GpuReader without blocking the event loop. Several tasks may
    read at once (one per engine): their readings are taken one after the other, so that NVML is
    opened once and never closed under a reading."""

    def __init__(self, reader: GpuReader) -> None:
        self._reader = reader
        self._opened = False
        self._last_reason: str | None = None
        self._lock = asyncio.Lock()

    async def read(self) -> GpuReading:
        """One reading of every GPU, or the reason there is none."""
        async with self._lock:
            return await self._read()

    async def _read(self) -> GpuReading:
        if not self._opened:
            try:
                await asyncio.to_thread(self._reader.open)
            except GpuReadError as exc:
                return self._unavailable(str(exc))
            self._opened = True
        try:
            devices = await asyncio.to_thread(self._reader.read_devices)
        except GpuReadError as exc:
            return self._unavailable(str(exc))
        if not devices:
            return self._unavailable("NVML reports no GPU")
        if self._last_reason != "":
            logger.info(
                "reading %d GPU(s) through NVML: %s",
                len(devices),
                ", ".join(f"{d.index}:{d.name}" for d in devices),
            )
            self._last_reason = ""
        return GpuReading(devices=tuple(devices), unavailable_reason="")

    async def close(self) -> None:
        """Release NVML if it was opened."""
        async with self._lock:
            if not self._opened:
                return
            self._opened = False
            try:
                await asyncio.to_thread(self._reader.close)
            except GpuReadError as exc:
                logger.warning("%s", exc)

    def _unavailable(self, reason: str) -> GpuReading:
        if reason != self._last_reason:
            logger.warning("no GPU readings through NVML: %s", reason)
            self._last_reason = reason
        return GpuReading(devices=(), unavailable_reason=reason)
