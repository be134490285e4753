"""Profiles: lookup, overrides, and the 7B profile's place relative to the measured 3B one."""

from __future__ import annotations

import dataclasses

import pytest

from engine_sim.profiles import PROFILES, StepCosts, effective_profile, profile_named
from slotshift.config import EngineSimConfig


def test_each_profile_is_filed_under_its_own_name() -> None:
    assert all(name == profile.name for name, profile in PROFILES.items())
    assert profile_named("h200-qwen2.5-7b").model_name == "Qwen/Qwen2.5-7B-Instruct"


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'tpu'.*h200-qwen2\.5-3b, h200-qwen2\.5-7b"):
        profile_named("tpu")


def test_unset_fields_take_the_profile_values() -> None:
    for name, profile in PROFILES.items():
        assert effective_profile(EngineSimConfig(profile=name)) == profile


def test_set_fields_override_only_themselves() -> None:
    config = EngineSimConfig(
        profile="h200-qwen2.5-7b", model_name="m", max_num_seqs=7, step_per_context_token_us=0.0
    )
    base = PROFILES["h200-qwen2.5-7b"]
    assert effective_profile(config) == dataclasses.replace(
        base,
        model_name="m",
        max_num_seqs=7,
        step=dataclasses.replace(base.step, per_context_token_us=0.0),
    )


def test_the_7b_profile_costs_more_per_step_and_holds_fewer_kv_blocks() -> None:
    small, large = PROFILES["h200-qwen2.5-3b"], PROFILES["h200-qwen2.5-7b"]
    assert large.model_weights_bytes > 2 * small.model_weights_bytes
    assert large.kv_cache_blocks < small.kv_cache_blocks
    assert large.kv_cache_bytes_per_token > small.kv_cache_bytes_per_token
    for field in dataclasses.fields(StepCosts):
        assert getattr(large.step, field.name) > getattr(small.step, field.name), field.name
    # The same 96-sequence batch of 512-token contexts takes about twice as long.
    ratio = large.step.step_ms(96, 96 * 512, 0) / small.step.step_ms(96, 96 * 512, 0)
    assert 1.5 < ratio < 3.0
    assert "not measured" in large.provenance


def test_step_costs_are_never_negative() -> None:
    with pytest.raises(ValueError, match="per_seq_ms"):
        StepCosts(base_ms=1.0, per_seq_ms=-0.1, per_context_token_us=0.0, per_prefill_token_us=0.0)


def test_step_time_is_the_linear_model() -> None:
    costs = StepCosts(
        base_ms=2.0, per_seq_ms=0.1, per_context_token_us=0.5, per_prefill_token_us=10.0
    )
    # 2 + 0.1 x 10 + 0.5 x 2000 / 1000 + 10 x 100 / 1000 = 2 + 1 + 1 + 1
    assert costs.step_ms(10, 2000, 100) == pytest.approx(5.0)
