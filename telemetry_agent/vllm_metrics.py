"""vLLM's Prometheus exposition, read into the figures the control plane needs.

vLLM V1 labels every series with `model_name` and `engine` (one engine per data-parallel rank).
Counts of requests and tokens add up over engines. KV-cache usage is the MAXIMUM over engines,
not the mean: each engine has its own cache and its own queue, and a request routed to a full
engine waits (or preempts) however empty its neighbours are, so the pool is as saturated as its
fullest engine; a mean would hide exactly the engine that makes requests wait.

The engine emulator (engine_sim) adds `slotshift_sim_gpu_*` gauges for the GPU it models; they
are read here too, so that a machine without NVML can still report the modelled GPU, marked as
emulated.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from telemetry_agent.histogram import CumulativeHistogram

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# vLLM before 0.10 published the same gauge under this name; read it only if the new one is absent.
LEGACY_KV_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
TTFT = "vllm:time_to_first_token_seconds"
SIM_GPU_UTILIZATION = "slotshift_sim_gpu_utilization_percent"
SIM_GPU_MEMORY_USED = "slotshift_sim_gpu_memory_used_bytes"
SIM_GPU_MEMORY_TOTAL = "slotshift_sim_gpu_memory_total_bytes"

SeriesKey = tuple[tuple[str, str], ...]
"""A series' labels other than `le`, sorted: identifies one histogram series across scrapes."""


class VllmMetricsError(ValueError):
    """The text cannot be read as a vLLM engine's metrics."""


class MalformedExpositionError(VllmMetricsError):
    """The text is not a well-formed Prometheus text exposition."""


class NotVllmMetricsError(VllmMetricsError):
    """A well-formed exposition, but without the gauges every vLLM V1 engine publishes."""


@dataclass(frozen=True)
class EmulatedGpu:
    """The GPU an engine emulator models (not a measurement)."""

    engine: str
    model_name: str
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class VllmSnapshot:
    """One scrape of a vLLM engine's /metrics; counters and histograms are since engine start."""

    model_name: str
    num_requests_running: float
    num_requests_waiting: float
    kv_cache_usage_perc: float
    prompt_tokens_total: float
    generation_tokens_total: float
    num_preemptions_total: float
    ttft_series: Mapping[SeriesKey, CumulativeHistogram] = field(default_factory=dict)
    """Each time-to-first-token series (one per engine), cumulative."""
    emulated_gpus: tuple[EmulatedGpu, ...] = ()
    """The emulator's modelled GPUs, one per engine; empty for a real vLLM."""


def parse_vllm_metrics(text: str) -> VllmSnapshot:
    """Read a /metrics body: MalformedExpositionError or NotVllmMetricsError if it cannot be.

    The request and KV-cache gauges must be there (vLLM creates them at start-up); a counter that
    is absent counts as 0, as Prometheus treats a series that was never incremented.
    """
    values: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                # A NaN gauge is "no value", never a figure to add up.
                if not math.isnan(sample.value):
                    values[sample.name].append((dict(sample.labels), float(sample.value)))
    except ValueError as exc:
        raise MalformedExpositionError(f"not a Prometheus text exposition: {exc}") from exc

    missing = [name for name in (RUNNING, WAITING) if name not in values]
    kv_name = KV_CACHE_USAGE if KV_CACHE_USAGE in values else LEGACY_KV_CACHE_USAGE
    if kv_name not in values:
        missing.append(KV_CACHE_USAGE)
    if missing:
        raise NotVllmMetricsError(f"no vLLM V1 metrics: {', '.join(missing)} missing")

    return VllmSnapshot(
        model_name=_model_name(values[RUNNING]),
        num_requests_running=_sum(values[RUNNING]),
        num_requests_waiting=_sum(values[WAITING]),
        kv_cache_usage_perc=max(value for _, value in values[kv_name]),
        prompt_tokens_total=_sum(values.get(PROMPT_TOKENS, [])),
        generation_tokens_total=_sum(values.get(GENERATION_TOKENS, [])),
        num_preemptions_total=_sum(values.get(PREEMPTIONS, [])),
        ttft_series=_histogram_series(values, TTFT),
        emulated_gpus=_emulated_gpus(values),
    )


def _sum(samples: list[tuple[dict[str, str], float]]) -> float:
    return sum(value for _, value in samples)


def _model_name(samples: list[tuple[dict[str, str], float]]) -> str:
    # One pool serves one model; should several appear, name them all rather than pick one.
    names = sorted({labels.get("model_name", "") for labels, _ in samples} - {""})
    return ",".join(names)


def _series_key(labels: Mapping[str, str]) -> SeriesKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def _histogram_series(
    values: Mapping[str, list[tuple[dict[str, str], float]]], name: str
) -> dict[SeriesKey, CumulativeHistogram]:
    buckets: dict[SeriesKey, list[tuple[float, float]]] = defaultdict(list)
    for labels, value in values.get(f"{name}_bucket", []):
        try:
            bound = float(labels["le"])
        except (KeyError, ValueError) as exc:
            raise MalformedExpositionError(
                f"{name}_bucket with a bad `le` label: {labels}"
            ) from exc
        buckets[_series_key(labels)].append((bound, value))
    created = {_series_key(labels): value for labels, value in values.get(f"{name}_created", [])}
    series: dict[SeriesKey, CumulativeHistogram] = {}
    for key, pairs in buckets.items():
        pairs.sort()
        try:
            series[key] = CumulativeHistogram(
                upper_bounds=tuple(bound for bound, _ in pairs),
                cumulative_counts=tuple(count for _, count in pairs),
                created_s=created.get(key),
            )
        except ValueError as exc:
            raise MalformedExpositionError(f"{name} {dict(key)}: {exc}") from exc
    return series


def _emulated_gpus(
    values: Mapping[str, list[tuple[dict[str, str], float]]],
) -> tuple[EmulatedGpu, ...]:
    by_engine: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for name in (SIM_GPU_UTILIZATION, SIM_GPU_MEMORY_USED, SIM_GPU_MEMORY_TOTAL):
        for labels, value in values.get(name, []):
            key = (labels.get("engine", ""), labels.get("model_name", ""))
            by_engine[key][name] = value
    gpus = []
    for (engine, model_name), gauges in sorted(by_engine.items()):
        # A half-published GPU is not reported: its missing figures would have to be made up.
        if len(gauges) < 3:
            continue
        gpus.append(
            EmulatedGpu(
                engine=engine,
                model_name=model_name,
                utilization_pct=gauges[SIM_GPU_UTILIZATION],
                memory_used_bytes=round(gauges[SIM_GPU_MEMORY_USED]),
                memory_total_bytes=round(gauges[SIM_GPU_MEMORY_TOTAL]),
            )
        )
    return tuple(gpus)
