"""Each engine's GPUs out of one reading of every GPU: by index, by UUID, from a file; NVML faked
at the pynvml boundary, so that the real reader reads the devices selected."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from slotshift.config import AgentEngineConfig, GpuSelector
from telemetry_agent.gpu import GpuMonitor, GpuReading, PynvmlReader
from telemetry_agent.gpu_selection import (
    EngineGpus,
    GpusFileError,
    parse_gpus_file,
    select_devices,
)
from tests.unit.telemetry_agent.fake_pynvml import FakeGpu, FakePynvml

UUIDS = (
    "GPU-5b3a9c1e-2f4d-4e6a-9b7c-0d1e2f3a4b5c",
    "GPU-0c8e1d2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f",
    "GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a",
)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
    gpus = [
        FakeGpu(uuid=uuid, utilization_pct=10 * (index + 1), memory_used_bytes=index + 1)
        for index, uuid in enumerate(UUIDS)
    ]
    return FakePynvml(gpus).install(monkeypatch)


async def _reading() -> GpuReading:
    monitor = GpuMonitor(PynvmlReader())
    try:
        return await monitor.read()
    finally:
        await monitor.close()


async def test_the_real_reader_reads_every_gpu_through_pynvml(nvml: FakePynvml) -> None:
    reading = await _reading()

    assert [(d.index, d.uuid, d.utilization_pct) for d in reading.devices] == [
        (0, UUIDS[0], 10.0),
        (1, UUIDS[1], 20.0),
        (2, UUIDS[2], 30.0),
    ]
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


@pytest.mark.parametrize(
    ("wanted", "indices"),
    [
        pytest.param(None, [0, 1, 2], id="unset-every-gpu"),
        pytest.param([1], [1], id="one-by-index"),
        pytest.param([2, 0], [0, 2], id="by-index-in-index-order"),
        pytest.param([UUIDS[1]], [1], id="one-by-uuid"),
        pytest.param(["GPU-" + UUIDS[2][4:].upper(), UUIDS[0]], [0, 2], id="uuid-any-case"),
    ],
)
async def test_an_engine_gets_the_gpus_it_names_and_no_other(
    nvml: FakePynvml, wanted: list[GpuSelector] | None, indices: list[int]
) -> None:
    selected = select_devices(await _reading(), wanted)

    assert selected.available
    assert [d.index for d in selected.devices] == indices
    assert [d.uuid for d in selected.devices] == [UUIDS[i] for i in indices]
    assert [d.utilization_pct for d in selected.devices] == [10.0 * (i + 1) for i in indices]


async def test_a_gpu_named_but_not_shown_leaves_the_engine_without_figures(
    nvml: FakePynvml,
) -> None:
    selected = select_devices(await _reading(), [1, 7])

    assert selected.devices == ()
    assert "GPU(s) [7] of this engine not found" in selected.unavailable_reason
    assert f"1:{UUIDS[1]}" in selected.unavailable_reason, "the reason lists what NVML shows"


async def test_an_engine_with_no_gpu_and_a_failed_reading_have_reasons(
    nvml: FakePynvml,
) -> None:
    assert select_devices(await _reading(), []).unavailable_reason == (
        "no GPU is configured for this engine"
    )
    nvml.lost = True
    lost = select_devices(await _reading(), [0])
    assert "GPU is lost" in lost.unavailable_reason, "NVML's own reason comes through"


@pytest.mark.parametrize(
    ("text", "selectors"),
    [
        pytest.param(f"{UUIDS[0]}\n{UUIDS[1]}\n", [UUIDS[0], UUIDS[1]], id="nvidia-smi-uuids"),
        pytest.param(f"{UUIDS[1]},{UUIDS[0]}", [UUIDS[1], UUIDS[0]], id="visible-devices-list"),
        pytest.param("# the engine's GPUs\n\n0\n 2 # second\n", [0, 2], id="indices-comments"),
        pytest.param("\n# nothing yet\n", [], id="empty"),
    ],
)
def test_a_gpus_file_names_indices_and_uuids(text: str, selectors: list[GpuSelector]) -> None:
    assert parse_gpus_file(text) == selectors


def test_a_gpus_file_entry_that_is_no_gpu_is_named() -> None:
    with pytest.raises(GpusFileError, match=r"line 2: 'all' is neither"):
        parse_gpus_file("0\nall\n")


async def test_a_gpus_file_is_followed_from_before_it_is_written(
    nvml: FakePynvml, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "engine-gpus"
    gpus = EngineGpus(
        AgentEngineConfig(pool="a", metrics_url="http://e:8000/metrics", gpus_file=str(path))
    )
    reading = await _reading()

    with caplog.at_level(logging.INFO, logger="telemetry_agent.gpu_selection"):
        before = [await gpus.select(reading) for _ in range(3)]
        path.write_text(f"{UUIDS[2]}\n")
        after = await gpus.select(reading)
        path.write_text("bogus\n")
        malformed = await gpus.select(reading)

    assert all(f"{path} is not written yet" in r.unavailable_reason for r in before)
    assert [d.uuid for d in after.devices] == [UUIDS[2]]
    assert "'bogus' is neither" in malformed.unavailable_reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, "each new reason once, not every reading"
    assert gpus.described == f"gpus_file {path}"
