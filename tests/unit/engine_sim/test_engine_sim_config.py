"""The emulator's section: a known profile at load, and a start refused where vLLM's would be."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from engine_sim.profiles import DEFAULT_PROFILE, PROFILES, effective_profile
from engine_sim.server import EngineSim
from slotshift.config import EngineSimConfig


def test_the_default_is_the_calibrated_3b_profile_and_fits() -> None:
    config = EngineSimConfig()
    assert config.profile == DEFAULT_PROFILE == "h200-qwen2.5-3b"
    profile = effective_profile(config)
    assert profile.kv_cache_blocks * config.block_size_tokens >= config.max_model_len


def test_the_config_lists_exactly_the_profiles_there_are() -> None:
    annotation = EngineSimConfig.model_fields["profile"].annotation
    assert set(get_args(annotation)) == set(PROFILES)


def test_an_unknown_profile_is_refused_at_load_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError) as caught:
        EngineSimConfig(profile="a100-llama")
    assert "h200-qwen2.5-3b" in str(caught.value)
    assert "h200-qwen2.5-7b" in str(caught.value)


def test_negative_overrides_are_refused_at_load() -> None:
    with pytest.raises(ValidationError, match="step_per_seq_ms"):
        EngineSimConfig(step_per_seq_ms=-0.1)


def test_a_cache_smaller_than_one_full_length_request_refuses_to_start() -> None:
    config = EngineSimConfig(kv_cache_blocks=10, block_size_tokens=16, max_model_len=161)
    with pytest.raises(ValueError, match="below max_model_len"):
        EngineSim(config)


def test_weights_and_cache_must_fit_gpu_memory() -> None:
    config = EngineSimConfig(gpu_memory_total_bytes=1_000_000_000, model_weights_bytes=900_000_000)
    with pytest.raises(ValueError, match="exceed gpu_memory_total_bytes"):
        effective_profile(config)
