"""Named hardware/model profiles of the emulator, and the effective settings a config selects.

A profile fixes what the GPU and the model decide: the step-time model's costs, vLLM's batch
limits, the KV cache and the memory. `EngineSimConfig.profile` names one; any of the config's
profile fields that is set overrides the profile's value. Engine code reads these values only
through `effective_profile(config)`.

- `h200-qwen2.5-3b` (default): fitted to the study's measurements (a real H200 serving
  Qwen2.5-3B-Instruct with vLLM); the points are in slotshift_tools/emulator/calibration.py and
  `scripts/fit_profile.py` refits the step costs and prints their residuals.
- `h200-qwen2.5-7b`: NOT measured. Qwen2.5-7B-Instruct on the same H200, scaled from the 3B fit
  (see the constants below): the study's named next step, a model that keeps the GPU busy.

Sizes both profiles share, as vLLM sets them on an H200 (see the constants' docstrings): batch
limits are vLLM's defaults for the OpenAI server on GPUs of 70 GiB or more (not A100);
KV blocks = (0.9 x GPU memory - weights - activation reserve) / (16 tokens x bytes per token).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from slotshift.config import EngineSimConfig


@dataclass(frozen=True)
class StepCosts:
    """The step-time model: how long one engine step takes for a given batch."""

    base_ms: float
    """Fixed cost of a step (weights read once per step, launch and host overhead)."""
    per_seq_ms: float
    """Added per sequence scheduled in the step."""
    per_context_token_us: float
    """Added per context token the scheduled sequences hold after the step."""
    per_prefill_token_us: float
    """Added per prompt token computed in the step (prefill or recompute)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 0:
                raise ValueError(f"step cost {field.name} must not be negative")

    def step_ms(self, num_seqs: float, context_tokens: float, prefill_tokens: float) -> float:
        """Milliseconds one step takes (arguments may be averages, so they are floats)."""
        return (
            self.base_ms
            + self.per_seq_ms * num_seqs
            + self.per_context_token_us * context_tokens / 1000.0
            + self.per_prefill_token_us * prefill_tokens / 1000.0
        )


@dataclass(frozen=True)
class EngineProfile:
    """One emulated GPU serving one model: everything that depends on the hardware or model."""

    name: str
    provenance: str
    """Where the values come from: measured and fitted, or assumed (and how)."""
    model_name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_blocks: int
    gpu_memory_total_bytes: int
    model_weights_bytes: int
    kv_cache_bytes_per_token: int
    step: StepCosts


H200_MEMORY_BYTES = 150_754_820_096
"""An H200's memory as NVML reports it (140.4 GiB)."""

H200_MAX_NUM_SEQS = 1024
"""vLLM V1's default --max-num-seqs for the OpenAI server on a GPU of 70 GiB or more."""

H200_MAX_NUM_BATCHED_TOKENS = 8192
"""vLLM V1's default --max-num-batched-tokens for the OpenAI server on such a GPU."""

QWEN25_3B_WEIGHTS_BYTES = 6_170_000_000
"""Qwen2.5-3B-Instruct in bf16 (3.09 B parameters x 2 bytes)."""

QWEN25_7B_WEIGHTS_BYTES = 15_230_000_000
"""Qwen2.5-7B-Instruct in bf16 (7.62 B parameters x 2 bytes)."""

QWEN25_3B_KV_BYTES_PER_TOKEN = 36 * 2 * 128 * 2 * 2
"""36 layers x 2 KV heads x 128 dims x (K, V) x 2 bytes = 36,864."""

QWEN25_7B_KV_BYTES_PER_TOKEN = 28 * 4 * 128 * 2 * 2
"""28 layers x 4 KV heads x 128 dims x (K, V) x 2 bytes = 57,344."""

H200_QWEN25_3B_STEP = StepCosts(
    base_ms=2.3282, per_seq_ms=0.022934, per_context_token_us=0.146581, per_prefill_token_us=12.0
)
"""Fitted by scripts/fit_profile.py to slotshift_tools/emulator/calibration.py's points (paste
its output here). per_prefill_token_us is not fitted (the study has no point that isolates it): it is the
compute-bound rate, 2 x 3.09 GFLOP per token at about 500 TFLOP/s effective on an H200."""

_7B_OVER_3B_PARAMETERS = 7.62 / 3.09
_7B_OVER_3B_KV_BYTES = QWEN25_7B_KV_BYTES_PER_TOKEN / QWEN25_3B_KV_BYTES_PER_TOKEN
_H200_WEIGHT_READ_BYTES_PER_MS = 3.6e9
"""HBM bandwidth a decode step reads weights at: 4.8 TB/s at about 75% efficiency."""

H200_QWEN25_7B_STEP = StepCosts(
    # A decode step reads every weight once: the larger model adds its extra bytes' read time.
    base_ms=round(
        H200_QWEN25_3B_STEP.base_ms
        + (QWEN25_7B_WEIGHTS_BYTES - QWEN25_3B_WEIGHTS_BYTES) / _H200_WEIGHT_READ_BYTES_PER_MS,
        4,
    ),
    # Per-sequence and prefill work are matrix products: they scale with the parameters.
    per_seq_ms=round(H200_QWEN25_3B_STEP.per_seq_ms * _7B_OVER_3B_PARAMETERS, 6),
    # Attention reads each context token's KV entries: it scales with their size.
    per_context_token_us=round(H200_QWEN25_3B_STEP.per_context_token_us * _7B_OVER_3B_KV_BYTES, 6),
    per_prefill_token_us=round(
        H200_QWEN25_3B_STEP.per_prefill_token_us * _7B_OVER_3B_PARAMETERS, 2
    ),
)
"""Assumed, not measured: the 3B fit scaled as the comments say."""

DEFAULT_PROFILE = "h200-qwen2.5-3b"
"""The profile a config gets when it names none."""

_T = TypeVar("_T")

PROFILES: Mapping[str, EngineProfile] = MappingProxyType(
    {
        profile.name: profile
        for profile in (
            EngineProfile(
                name="h200-qwen2.5-3b",
                provenance="measured: step costs fitted to the study's three H200 runs",
                model_name="Qwen/Qwen2.5-3B-Instruct",
                max_num_seqs=H200_MAX_NUM_SEQS,
                max_num_batched_tokens=H200_MAX_NUM_BATCHED_TOKENS,
                # (0.9 x 150.75 GB - 6.17 GB weights - 4 GB activations) / 589,824 B per block
                kv_cache_blocks=212_000,
                gpu_memory_total_bytes=H200_MEMORY_BYTES,
                model_weights_bytes=QWEN25_3B_WEIGHTS_BYTES,
                kv_cache_bytes_per_token=QWEN25_3B_KV_BYTES_PER_TOKEN,
                step=H200_QWEN25_3B_STEP,
            ),
            EngineProfile(
                name="h200-qwen2.5-7b",
                provenance="assumed, not measured: the 3B fit scaled to Qwen2.5-7B's weights and KV",
                model_name="Qwen/Qwen2.5-7B-Instruct",
                max_num_seqs=H200_MAX_NUM_SEQS,
                max_num_batched_tokens=H200_MAX_NUM_BATCHED_TOKENS,
                # (0.9 x 150.75 GB - 15.23 GB weights - 5 GB activations) / 917,504 B per block
                kv_cache_blocks=125_000,
                gpu_memory_total_bytes=H200_MEMORY_BYTES,
                model_weights_bytes=QWEN25_7B_WEIGHTS_BYTES,
                kv_cache_bytes_per_token=QWEN25_7B_KV_BYTES_PER_TOKEN,
                step=H200_QWEN25_7B_STEP,
            ),
        )
    }
)
"""Every profile by name; EngineSimConfig.profile lists the same names."""


def profile_named(name: str) -> EngineProfile:
    """The profile called `name`; ValueError naming the known ones if there is none."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown emulator profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}"
        ) from None


def effective_profile(config: EngineSimConfig) -> EngineProfile:
    """The config's profile with the config's overrides applied.

    ValueError when vLLM would refuse to start: one full-length request does not fit the KV
    cache, or weights and cache do not fit GPU memory.
    """
    base = profile_named(config.profile)
    step = StepCosts(
        base_ms=_pick(config.step_base_ms, base.step.base_ms),
        per_seq_ms=_pick(config.step_per_seq_ms, base.step.per_seq_ms),
        per_context_token_us=_pick(
            config.step_per_context_token_us, base.step.per_context_token_us
        ),
        per_prefill_token_us=_pick(
            config.step_per_prefill_token_us, base.step.per_prefill_token_us
        ),
    )
    profile = dataclasses.replace(
        base,
        model_name=_pick(config.model_name, base.model_name),
        max_num_seqs=_pick(config.max_num_seqs, base.max_num_seqs),
        max_num_batched_tokens=_pick(config.max_num_batched_tokens, base.max_num_batched_tokens),
        kv_cache_blocks=_pick(config.kv_cache_blocks, base.kv_cache_blocks),
        gpu_memory_total_bytes=_pick(config.gpu_memory_total_bytes, base.gpu_memory_total_bytes),
        model_weights_bytes=_pick(config.model_weights_bytes, base.model_weights_bytes),
        kv_cache_bytes_per_token=_pick(
            config.kv_cache_bytes_per_token, base.kv_cache_bytes_per_token
        ),
        step=step,
    )
    _check_fits(profile, config)
    return profile


def _pick(override: _T | None, profile_value: _T) -> _T:
    return profile_value if override is None else override


def _check_fits(profile: EngineProfile, config: EngineSimConfig) -> None:
    cache_tokens = profile.kv_cache_blocks * config.block_size_tokens
    if cache_tokens < config.max_model_len:
        raise ValueError(
            f"kv_cache_blocks x block_size_tokens ({cache_tokens} tokens) is below "
            f"max_model_len ({config.max_model_len})"
        )
    needed = profile.model_weights_bytes + cache_tokens * profile.kv_cache_bytes_per_token
    if needed > profile.gpu_memory_total_bytes:
        raise ValueError(
            f"model_weights_bytes plus the KV cache ({needed} bytes) exceed "
            f"gpu_memory_total_bytes ({profile.gpu_memory_total_bytes})"
        )
