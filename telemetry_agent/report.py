"""Assembling one TelemetryReport from an engine scrape and a GPU reading."""

from __future__ import annotations

from slotshift.v1 import telemetry_pb2
from slotshift.wire import to_timestamp
from telemetry_agent.engine_scraper import EngineScrape
from telemetry_agent.gpu import GpuReading


def build_report(
    *,
    pool: str,
    agent_id: str,
    observed_at_s: float,
    gpu: GpuReading,
    engine: EngineScrape,
) -> telemetry_pb2.TelemetryReport:
    """The report for one interval.

    GPU figures come from NVML when it answered; else from the engine emulator's modelled GPU,
    marked GPU_SOURCE_EMULATED; else there are none, and gpu_unavailable_reason says why.
    observed_at_s is wall-clock seconds since the epoch.
    """
    report = telemetry_pb2.TelemetryReport(
        pool=pool, agent_id=agent_id, observed_at=to_timestamp(observed_at_s), engine=engine.sample
    )
    if gpu.available:
        report.gpu_source = telemetry_pb2.GPU_SOURCE_NVML
        report.gpus.extend(
            telemetry_pb2.GpuSample(
                index=device.index,
                uuid=device.uuid,
                name=device.name,
                utilization_pct=device.utilization_pct,
                memory_used_bytes=device.memory_used_bytes,
                memory_total_bytes=device.memory_total_bytes,
            )
            for device in gpu.devices
        )
    elif engine.emulated_gpus:
        report.gpu_source = telemetry_pb2.GPU_SOURCE_EMULATED
        report.gpus.extend(
            telemetry_pb2.GpuSample(
                index=_engine_index(modelled.engine, position),
                name=f"emulated GPU of {modelled.model_name or 'the engine'}",
                utilization_pct=modelled.utilization_pct,
                memory_used_bytes=modelled.memory_used_bytes,
                memory_total_bytes=modelled.memory_total_bytes,
            )
            for position, modelled in enumerate(engine.emulated_gpus)
        )
    else:
        report.gpu_source = telemetry_pb2.GPU_SOURCE_UNAVAILABLE
        report.gpu_unavailable_reason = gpu.unavailable_reason
    return report


def _engine_index(engine_label: str, position: int) -> int:
    # The emulator labels its engine "0", "1", ... like vLLM; fall back to the order listed.
    return int(engine_label) if engine_label.isdigit() else position
