"""The shape of Prometheus metric families (type, help text, label names and values, histogram
buckets), to compare the emulator's vLLM metrics with real vLLM's."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from engine_sim.server import EngineSim
from slotshift.config import EngineSimConfig

CLAIMED_VLLM_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
)
"""The vLLM V1 metrics the emulator publishes, as a scrape names them."""

KNOWN_DIFFERENCES: set[str] = set()
"""How the emulator differs from vLLM 0.32, known and reported. The tests compare with this set
exactly: a new difference fails them, and so does one that is fixed (so that it stays true)."""

DEPLOYMENT_LABELS = frozenset({"model_name"})
"""Labels whose values depend on what is served, not on the metric's definition."""


@dataclass(frozen=True)
class FamilyShape:
    """What defines one metric family, apart from its values."""

    type: str
    documentation: str
    label_names: tuple[str, ...]
    """Of its series, sorted; `le` (a histogram's bucket) left out."""
    label_values: tuple[tuple[str, tuple[str, ...]], ...]
    """Each label's values over the series (sorted), but DEPLOYMENT_LABELS'."""
    bucket_bounds: tuple[float, ...]
    """A histogram's upper bounds, +Inf included; empty for other types."""


def family_shapes(text: str) -> dict[str, FamilyShape]:
    """Every family of an exposition, by the name a scrape shows (counters with `_total`)."""
    shapes: dict[str, FamilyShape] = {}
    for family in text_string_to_metric_families(text):
        main = [s for s in family.samples if not s.name.endswith("_created")]
        names = sorted({k for s in main for k in s.labels if k != "le"})
        values = tuple(
            (name, tuple(sorted({s.labels[name] for s in main if name in s.labels})))
            for name in names
            if name not in DEPLOYMENT_LABELS
        )
        bounds = sorted(
            {float(s.labels["le"]) for s in main if s.name.endswith("_bucket") and "le" in s.labels}
        )
        exposed = f"{family.name}_total" if family.type == "counter" else family.name
        shapes[exposed] = FamilyShape(
            type=family.type,
            documentation=family.documentation,
            label_names=tuple(names),
            label_values=values,
            bucket_bounds=tuple(bounds),
        )
    return shapes


def shape_differences(emulator_text: str, vllm_text: str) -> set[str]:
    """How the emulator's CLAIMED_VLLM_METRICS differ from real vLLM's, one line per difference
    (empty when they agree)."""
    emulator, real = family_shapes(emulator_text), family_shapes(vllm_text)
    differences: set[str] = set()
    for name in CLAIMED_VLLM_METRICS:
        if name not in real:
            differences.add(f"{name}: real vLLM does not publish it")
            continue
        if name not in emulator:
            differences.add(f"{name}: the emulator does not publish it")
            continue
        ours, theirs = emulator[name], real[name]
        for field in ("type", "documentation", "label_names", "bucket_bounds"):
            if getattr(ours, field) != getattr(theirs, field):
                differences.add(
                    f"{name}: {field} is {getattr(ours, field)!r} in the emulator, "
                    f"{getattr(theirs, field)!r} in vLLM"
                )
        ours_values, theirs_values = dict(ours.label_values), dict(theirs.label_values)
        for label in sorted(set(ours_values) & set(theirs_values)):
            if ours_values[label] != theirs_values[label]:
                differences.add(
                    f"{name}: label {label} takes {ours_values[label]!r} in the emulator, "
                    f"{theirs_values[label]!r} in vLLM"
                )
    return differences


async def emulator_scrape() -> str:
    """The emulator's /metrics after one request, from an in-process emulator on port 0."""
    sim = EngineSim(EngineSimConfig(port=0))
    await sim.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{sim.url}/v1/models") as response:
                model = (await response.json())["data"][0]["id"]
            body = {"model": model, "prompt": "Hello", "max_tokens": 4, "ignore_eos": True}
            async with session.post(f"{sim.url}/v1/completions", json=body) as response:
                assert response.status == 200
            async with session.get(f"{sim.url}/metrics") as response:
                return await response.text()
    finally:
        await sim.stop()
