"""A stand-in for the NVML library at the pynvml boundary: the functions PynvmlReader calls,
answering for scripted GPUs, installed with pytest's monkeypatch. The reader's own code (the
calls, the bytes-or-str handling, the error wrapping) runs for real; only the driver is fake."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pynvml
import pytest


@dataclass
class FakeGpu:
    """One GPU as the fake driver answers for it."""

    uuid: str
    name: str = "NVIDIA H200"
    utilization_pct: int = 0
    memory_used_bytes: int = 0
    memory_total_bytes: int = 150_754_820_096


class FakePynvml:
    """Scripted GPUs behind pynvml's functions; `lost` makes every device call fail as a fallen
    GPU does (NVML_ERROR_GPU_IS_LOST). Counts nvmlInit and nvmlShutdown."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.lost = False
        self.inits = 0
        self.shutdowns = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
        """Replace pynvml's functions with this fake's for the test's duration."""
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetMemoryInfo",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> bytes:
        # As older nvidia-ml-py releases do: the reader must accept bytes.
        return handle.uuid.encode()

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=handle.utilization_pct, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(
            used=handle.memory_used_bytes,
            total=handle.memory_total_bytes,
            free=handle.memory_total_bytes - handle.memory_used_bytes,
        )
