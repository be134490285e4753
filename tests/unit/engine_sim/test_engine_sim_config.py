"""The emulator's section fails at load when vLLM would fail to start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from slotshift.config import EngineSimConfig


def test_defaults_are_valid() -> None:
    config = EngineSimConfig()
    assert config.kv_cache_blocks * config.block_size_tokens >= config.max_model_len


def test_a_cache_smaller_than_one_full_length_request_is_refused() -> None:
    with pytest.raises(ValidationError, match="below max_model_len"):
        EngineSimConfig(kv_cache_blocks=10, block_size_tokens=16, max_model_len=161)


def test_weights_and_cache_must_fit_gpu_memory() -> None:
    with pytest.raises(ValidationError, match="exceed gpu_memory_total_bytes"):
        EngineSimConfig(gpu_memory_total_bytes=1_000_000_000, model_weights_bytes=900_000_000)
