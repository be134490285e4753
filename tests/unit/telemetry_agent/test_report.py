"""Report assembly: where GPU figures come from, and what an unreadable GPU leaves."""

from __future__ import annotations

from slotshift.v1 import telemetry_pb2
from telemetry_agent.engine_scraper import EngineScrape
from telemetry_agent.gpu import GpuReading
from telemetry_agent.report import build_report
from telemetry_agent.vllm_metrics import EmulatedGpu
from tests.unit.telemetry_agent.fake_nvml import H200

NO_NVML = GpuReading(devices=(), unavailable_reason="NVML Shared Library Not Found")
MODELLED = EmulatedGpu(
    engine="0",
    model_name="Qwen/Qwen2.5-3B-Instruct",
    utilization_pct=67.5,
    memory_used_bytes=120_000_000_000,
    memory_total_bytes=150_000_000_000,
)


def engine_scrape(*emulated: EmulatedGpu) -> EngineScrape:
    return EngineScrape(
        sample=telemetry_pb2.EngineSample(scrape_ok=True, num_requests_running=3),
        emulated_gpus=emulated,
        error_reason=None,
        duration_s=0.01,
    )


def report(gpu: GpuReading, engine: EngineScrape) -> telemetry_pb2.TelemetryReport:
    return build_report(
        pool="pool-a", agent_id="node-1", observed_at_s=1_700_000_000.25, gpu=gpu, engine=engine
    )


def test_nvml_figures_are_reported_as_measured() -> None:
    result = report(GpuReading(devices=(H200,), unavailable_reason=""), engine_scrape(MODELLED))
    assert result.pool == "pool-a"
    assert result.agent_id == "node-1"
    assert result.observed_at.ToNanoseconds() == 1_700_000_000_250_000_000
    assert result.engine.num_requests_running == 3
    assert result.gpu_source == telemetry_pb2.GPU_SOURCE_NVML
    assert result.gpu_unavailable_reason == ""
    assert list(result.gpus) == [
        telemetry_pb2.GpuSample(
            index=0,
            uuid=H200.uuid,
            name="NVIDIA H200",
            utilization_pct=87.0,
            memory_used_bytes=120_259_084_288,
            memory_total_bytes=150_754_820_096,
        )
    ]


def test_without_nvml_the_emulated_gpu_is_reported_as_emulated() -> None:
    result = report(NO_NVML, engine_scrape(MODELLED))
    assert result.gpu_source == telemetry_pb2.GPU_SOURCE_EMULATED
    assert len(result.gpus) == 1
    gpu = result.gpus[0]
    assert (gpu.index, gpu.uuid) == (0, "")
    assert "emulated" in gpu.name
    assert gpu.utilization_pct == 67.5
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (120_000_000_000, 150_000_000_000)


def test_without_nvml_or_emulator_there_are_no_gpu_figures_and_the_reason_is_given() -> None:
    result = report(NO_NVML, engine_scrape())
    assert result.gpu_source == telemetry_pb2.GPU_SOURCE_UNAVAILABLE
    assert result.gpu_unavailable_reason == "NVML Shared Library Not Found"
    assert list(result.gpus) == []
