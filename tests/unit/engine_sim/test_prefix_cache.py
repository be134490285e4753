"""The core's prefix cache and its context-driven tokens: a paused request's continuation
generates what the request would have, and finds its computed blocks cached."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_sim.engine_core import EngineCore, FinishedRequest, FinishReason, RequestSpec
from engine_sim.tokens import EOS_TOKEN_ID, reference_output_ids, synthetic_prompt_ids
from slotshift.clock import ManualClock
from slotshift.config import EngineSimConfig

BLOCK = 16


def make_config(**overrides: Any) -> EngineSimConfig:
    fields: dict[str, Any] = {
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "kv_cache_blocks": 4096,
        "block_size_tokens": BLOCK,
        "max_model_len": 4096,
        "pseudo_eos_max_tokens": 40,
    }
    fields.update(overrides)
    return EngineSimConfig(**fields)


class Driver:
    """One core stepped by hand, remembering each request's output ids."""

    def __init__(self, config: EngineSimConfig) -> None:
        self.core, self.clock = EngineCore(config), ManualClock()
        self.outputs: dict[str, list[int]] = {}
        self.finished: dict[str, FinishedRequest] = {}
        self.steps: list[tuple[list[str], int]] = []
        """Each step's request ids and prefill tokens."""

    def add(self, spec: RequestSpec) -> None:
        self.outputs[spec.request_id] = []
        self.core.add_request(spec, self.clock.monotonic())

    def step(self) -> None:
        step = self.core.schedule(self.clock.monotonic())
        self.steps.append((step.request_ids, step.prefill_tokens))
        self.clock.advance(step.duration_s)
        outcome = self.core.complete(step, self.clock.monotonic())
        for token in outcome.tokens:
            self.outputs[token.request_id].append(token.token_id)
        for finished in outcome.finished:
            self.finished[finished.request_id] = finished

    def run_until_idle(self) -> None:
        for _ in range(100_000):
            if not self.core.has_work:
                return
            self.step()
        raise AssertionError("the engine did not drain")

    def run_until_tokens(self, request_id: str, count: int) -> None:
        while len(self.outputs[request_id]) < count and request_id in self.core:
            self.step()

    def abort(self, request_id: str) -> None:
        finished = self.core.abort(request_id, self.clock.monotonic())
        assert finished is not None
        self.finished[request_id] = finished


def continuation(
    original: RequestSpec, generated: list[int], request_id: str = "resumed"
) -> RequestSpec:
    """What the gateway sends to resume `original` after `generated` output tokens."""
    return RequestSpec(
        request_id,
        original.prompt_token_ids + tuple(generated),
        original.max_output_tokens - len(generated),
        ignore_eos=original.ignore_eos,
        min_tokens=max(0, original.min_tokens - len(generated)),
    )


def whole_output(spec: RequestSpec, config: EngineSimConfig) -> list[int]:
    driver = Driver(config)
    driver.add(spec)
    driver.run_until_idle()
    return driver.outputs[spec.request_id]


@settings(max_examples=150, deadline=None)
@given(
    prompt_tokens=st.integers(1, 70),
    max_tokens=st.integers(1, 60),
    ignore_eos=st.booleans(),
    min_tokens=st.integers(0, 60),
    cut=st.integers(0, 60),
    caching=st.booleans(),
)
def test_a_continuation_cut_anywhere_equals_the_whole_request(
    prompt_tokens: int, max_tokens: int, ignore_eos: bool, min_tokens: int, cut: int, caching: bool
) -> None:
    config = make_config(enable_prefix_caching=caching)
    original = RequestSpec(
        "original",
        synthetic_prompt_ids(f"p{prompt_tokens}", prompt_tokens),
        max_tokens,
        ignore_eos=ignore_eos,
        min_tokens=min(min_tokens, max_tokens),
    )
    whole = whole_output(original, config)
    assert whole == reference_output_ids(
        original.prompt_token_ids,
        max_tokens,
        ignore_eos=ignore_eos,
        min_tokens=original.min_tokens,
        pseudo_eos_max_tokens=40,
    )
    cut = min(cut, len(whole) - 1)  # a request that ended is not resumed

    driver = Driver(config)
    driver.add(original)
    driver.run_until_tokens("original", cut)
    driver.abort("original")
    generated = driver.outputs["original"][:cut]
    resumed = continuation(original, generated)
    driver.add(resumed)
    driver.run_until_idle()

    assert generated + driver.outputs["resumed"] == whole
    assert driver.finished["resumed"].reason is expected_reason(whole)
    if caching and cut > 0:
        # The original computed its prompt and all but its last output token: every full block
        # of that is cached, and the continuation finds all of them.
        assert (
            driver.finished["resumed"].cached_tokens == (prompt_tokens + cut - 1) // BLOCK * BLOCK
        )
    else:
        assert driver.finished["resumed"].cached_tokens == 0


def expected_reason(whole: list[int]) -> FinishReason:
    """Why a request with this output ended: the pseudo-EOS, else max_tokens."""
    return FinishReason.STOP if whole[-1] == EOS_TOKEN_ID else FinishReason.LENGTH


def ignoring_eos(request_id: str, prompt: tuple[int, ...], max_tokens: int = 1) -> RequestSpec:
    return RequestSpec(request_id, prompt, max_tokens, ignore_eos=True)


def test_a_continuation_moves_the_counters_by_its_prefixs_full_blocks() -> None:
    driver = Driver(make_config())
    original = ignoring_eos("original", synthetic_prompt_ids("a", 40), max_tokens=30)
    driver.add(original)
    driver.run_until_tokens("original", 20)
    driver.abort("original")
    assert (driver.core.prefix_cache_queries_total, driver.core.prefix_cache_hits_total) == (40, 0)

    driver.add(continuation(original, driver.outputs["original"][:20]))
    driver.step()

    # 60 tokens; the original computed 59 of them, so 3 full blocks (48 tokens) are cached.
    assert driver.core.prefix_cache_queries_total == 40 + 60
    assert driver.core.prefix_cache_hits_total == 48
    # Cached tokens are not prefill work: the step computed the 12 others.
    assert driver.steps[-1] == (["resumed"], 12)
    driver.run_until_idle()
    assert driver.finished["resumed"].cached_tokens == 48


def test_distinct_prompts_get_no_hit() -> None:
    driver = Driver(make_config())
    for name in ("a", "b", "c"):
        driver.add(ignoring_eos(name, synthetic_prompt_ids(name, 64)))
        driver.run_until_idle()

    assert driver.core.prefix_cache_queries_total == 3 * 64
    assert driver.core.prefix_cache_hits_total == 0
    assert driver.core.cached_blocks == 3 * 4
    assert driver.core.used_blocks == 0  # cached but evictable blocks count as free, as in vLLM


@pytest.mark.parametrize(
    ("prompt_tokens", "hit_tokens"),
    [
        pytest.param(32, 16, id="the-last-token-is-always-computed"),
        pytest.param(33, 32, id="every-full-block-before-it"),
        pytest.param(15, 0, id="no-full-block"),
    ],
)
def test_a_repeated_prompt_hits_its_full_blocks_but_its_last_token(
    prompt_tokens: int, hit_tokens: int
) -> None:
    driver = Driver(make_config())
    prompt = synthetic_prompt_ids("same", prompt_tokens)
    driver.add(ignoring_eos("first", prompt))
    driver.run_until_idle()

    driver.add(ignoring_eos("again", prompt))
    driver.run_until_idle()

    assert driver.finished["again"].cached_tokens == hit_tokens
    assert driver.core.prefix_cache_hits_total == hit_tokens
    assert driver.outputs["again"] == driver.outputs["first"]


def test_concurrent_requests_share_a_cached_prefix() -> None:
    driver = Driver(make_config())
    shared = synthetic_prompt_ids("system prompt", 64)
    driver.add(ignoring_eos("first", (*shared, 7), max_tokens=20))
    driver.step()  # the first's prefill caches the 4 shared blocks
    for name in ("second", "third"):
        driver.add(ignoring_eos(name, (*shared, 8), max_tokens=20))
    driver.step()

    assert driver.core.prefix_cache_hits_total == 2 * 64
    # One copy of the prefix, held three times; each request's own last block apart.
    assert driver.core.used_blocks == 4 + 3
    driver.run_until_idle()
    assert driver.outputs["second"] == driver.outputs["third"] != driver.outputs["first"]


def test_block_pressure_evicts_the_least_recently_freed_blocks_first() -> None:
    # 12 blocks. a and b each cache 3 full blocks of their 56-token prompts, a first; c's 128
    # tokens then need 8 blocks: the 6 never used and 2 evicted, which must be a's.
    driver = Driver(make_config(kv_cache_blocks=12, max_model_len=160))
    prompts = {name: synthetic_prompt_ids(name, 56) for name in ("a", "b")}
    for name, prompt in prompts.items():
        driver.add(ignoring_eos(name, prompt))
        driver.run_until_idle()
    assert driver.core.cached_blocks == 6  # free blocks are not yet needed: nothing evicted

    driver.add(ignoring_eos("c", synthetic_prompt_ids("c", 128)))
    driver.run_until_idle()
    assert driver.core.cached_blocks == 6 - 2 + 8

    driver.add(ignoring_eos("b again", prompts["b"]))
    driver.run_until_idle()
    assert driver.finished["b again"].cached_tokens == 48  # b's blocks, freed later, survived
    driver.add(ignoring_eos("a again", prompts["a"]))
    driver.run_until_idle()
    assert driver.finished["a again"].cached_tokens < 48


def test_an_evictable_hit_is_not_also_allocated() -> None:
    # 5 blocks: "a" leaves 3 cached blocks and 2 free. Its repeat needs its 3 cached blocks and
    # 1 more; a repeat that counted its own hits as free could be admitted beside "big".
    driver = Driver(make_config(kv_cache_blocks=5, max_model_len=80))
    prompt = synthetic_prompt_ids("a", 56)
    driver.add(ignoring_eos("a", prompt))
    driver.run_until_idle()

    driver.add(ignoring_eos("big", synthetic_prompt_ids("big", 16), max_tokens=40))
    driver.step()  # big holds 2 blocks (one evicted from a's), growing
    driver.add(ignoring_eos("a again", prompt))
    driver.run_until_idle()

    assert 0 <= driver.core.used_blocks <= 5
    assert set(driver.finished) == {"a", "big", "a again"}


def test_without_prefix_caching_nothing_is_cached_or_counted() -> None:
    driver = Driver(make_config(enable_prefix_caching=False))
    prompt = synthetic_prompt_ids("same", 64)
    driver.add(ignoring_eos("first", prompt))
    driver.run_until_idle()
    driver.add(ignoring_eos("again", prompt))
    driver.run_until_idle()

    assert driver.core.cached_blocks == 0
    assert (driver.core.prefix_cache_queries_total, driver.core.prefix_cache_hits_total) == (0, 0)
    assert driver.finished["again"].cached_tokens == 0
    assert driver.steps[-1] == (["again"], 64)  # all of it prefilled again


def test_a_preempted_requests_readmission_is_not_counted_again() -> None:
    # As test_engine_core's preemption case: two 48 + 64 token sequences in 8 blocks.
    driver = Driver(make_config(kv_cache_blocks=8, max_model_len=128))
    driver.add(ignoring_eos("old", synthetic_prompt_ids("old", 48), max_tokens=64))
    driver.add(ignoring_eos("new", synthetic_prompt_ids("new", 48), max_tokens=64))
    driver.run_until_idle()

    assert driver.core.preemptions_total >= 1
    assert driver.core.prefix_cache_queries_total == 96
    assert len(driver.outputs["new"]) == 64
    assert driver.outputs["new"] == reference_output_ids(
        synthetic_prompt_ids("new", 48), 64, ignore_eos=True
    )
