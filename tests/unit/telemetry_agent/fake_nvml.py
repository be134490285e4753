"""A GpuReader standing in for NVML: scripted devices or failures, calls counted."""

from __future__ import annotations

from telemetry_agent.gpu import GpuDeviceReading, GpuReadError

H200 = GpuDeviceReading(
    index=0,
    uuid="GPU-5b3a9c1e-2f4d-4e6a-9b7c-0d1e2f3a4b5c",
    name="NVIDIA H200",
    utilization_pct=87.0,
    memory_used_bytes=120_259_084_288,
    memory_total_bytes=150_754_820_096,
)


class FakeNvml:
    """open_error / read_error, when set, are raised by open() / read_devices()."""

    def __init__(self, devices: list[GpuDeviceReading] | None = None) -> None:
        self.devices = [H200] if devices is None else devices
        self.open_error: str | None = None
        self.read_error: str | None = None
        self.opens = 0
        self.closes = 0

    def open(self) -> None:
        self.opens += 1
        if self.open_error is not None:
            raise GpuReadError(self.open_error)

    def read_devices(self) -> list[GpuDeviceReading]:
        if self.read_error is not None:
            raise GpuReadError(self.read_error)
        return list(self.devices)

    def close(self) -> None:
        self.closes += 1
