"""GPU readings: NVML through a fake reader, and the real pynvml where no driver is installed."""

from __future__ import annotations

import ctypes
import logging

import pytest

from telemetry_agent.gpu import GpuMonitor, PynvmlReader
from tests.unit.telemetry_agent.fake_nvml import H200, FakeNvml


def _nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


NVML_PRESENT = _nvml_library_loads()


async def test_fake_nvml_devices_are_read() -> None:
    reader = FakeNvml()
    monitor = GpuMonitor(reader)
    reading = await monitor.read()
    await monitor.close()
    assert reading.available
    assert reading.devices == (H200,)
    assert reading.unavailable_reason == ""
    assert (reader.opens, reader.closes) == (1, 1)


async def test_nvml_that_cannot_start_gives_a_reason_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = FakeNvml()
    reader.open_error = "NVML initialisation failed: NVML Shared Library Not Found"
    monitor = GpuMonitor(reader)
    with caplog.at_level(logging.WARNING, logger="telemetry_agent.gpu"):
        readings = [await monitor.read() for _ in range(3)]
    assert all(not r.available and r.devices == () for r in readings)
    assert readings[0].unavailable_reason == reader.open_error
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert reader.opens == 3  # tried again each time: a driver loaded later is picked up
    await monitor.close()
    assert reader.closes == 0  # never opened, nothing to release


async def test_a_gpu_that_stops_answering_and_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    reader = FakeNvml()
    monitor = GpuMonitor(reader)
    with caplog.at_level(logging.INFO, logger="telemetry_agent.gpu"):
        assert (await monitor.read()).available
        reader.read_error = "NVML read failed: GPU is lost"
        lost = await monitor.read()
        reader.read_error = None
        back = await monitor.read()
    await monitor.close()
    assert lost.unavailable_reason == "NVML read failed: GPU is lost"
    assert back.devices == (H200,)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("GPU is lost" in m for m in messages) == 1
    assert sum("reading 1 GPU(s)" in m for m in messages) == 2  # found, then found again


async def test_nvml_without_gpus_is_unavailable() -> None:
    monitor = GpuMonitor(FakeNvml(devices=[]))
    reading = await monitor.read()
    await monitor.close()
    assert reading.unavailable_reason == "NVML reports no GPU"


@pytest.mark.skipif(NVML_PRESENT, reason="this machine has an NVIDIA driver")
async def test_real_pynvml_without_a_driver_says_the_library_is_missing() -> None:
    monitor = GpuMonitor(PynvmlReader())
    reading = await monitor.read()
    await monitor.close()
    assert not reading.available
    assert reading.devices == ()
    assert "NVML" in reading.unavailable_reason
    assert "Not Found" in reading.unavailable_reason


@pytest.mark.skipif(not NVML_PRESENT, reason="no NVIDIA driver on this machine")
async def test_real_pynvml_reads_every_gpu() -> None:
    monitor = GpuMonitor(PynvmlReader())
    reading = await monitor.read()
    await monitor.close()
    assert reading.available, reading.unavailable_reason
    assert [d.index for d in reading.devices] == list(range(len(reading.devices)))
    for device in reading.devices:
        assert device.uuid.startswith("GPU-")
        assert device.name
        assert 0.0 <= device.utilization_pct <= 100.0
        assert 0 < device.memory_used_bytes <= device.memory_total_bytes
