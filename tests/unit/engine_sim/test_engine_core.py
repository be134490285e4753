"""The pure batching model, stepped by hand with a ManualClock: no sleeping, no event loop."""

from __future__ import annotations

import math
from typing import Any

import pytest

from engine_sim.engine_core import (
    EngineCore,
    FinishedRequest,
    FinishReason,
    RequestSpec,
    StepOutcome,
    TokenEmitted,
)
from engine_sim.tokens import EOS_TOKEN_ID, synthetic_prompt_ids
from slotshift.clock import ManualClock
from slotshift.config import EngineSimConfig


def make_config(**overrides: Any) -> EngineSimConfig:
    fields: dict[str, Any] = {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "kv_cache_blocks": 4096,
        "block_size_tokens": 16,
        "max_model_len": 4096,
        "step_base_ms": 2.33,
        "step_per_seq_ms": 0.104,
        "step_per_context_token_us": 0.0,
        "step_per_prefill_token_us": 20.0,
    }
    fields.update(overrides)
    return EngineSimConfig(**fields)


def spec(
    request_id: str,
    prompt: int = 16,
    max_tokens: int = 8,
    *,
    ignore_eos: bool = True,
    min_tokens: int = 0,
) -> RequestSpec:
    """A request with a prompt of `prompt` ids of its own (no prefix shared with another's)."""
    return RequestSpec(
        request_id,
        synthetic_prompt_ids(request_id, prompt),
        max_tokens,
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
    )


def run_step(core: EngineCore, clock: ManualClock) -> StepOutcome:
    step = core.schedule(clock.monotonic())
    clock.advance(step.duration_s)
    return core.complete(step, clock.monotonic())


def run_until_idle(
    core: EngineCore, clock: ManualClock, max_steps: int = 100_000
) -> tuple[list[TokenEmitted], list[FinishedRequest]]:
    tokens: list[TokenEmitted] = []
    finished: list[FinishedRequest] = []
    for _ in range(max_steps):
        if not core.has_work:
            return tokens, finished
        outcome = run_step(core, clock)
        tokens += outcome.tokens
        finished += outcome.finished
    raise AssertionError(f"the engine did not drain in {max_steps} steps")


def test_batch_holds_at_most_max_num_seqs_and_the_rest_wait_in_order() -> None:
    core, clock = EngineCore(make_config(max_num_seqs=4)), ManualClock()
    for i in range(10):
        core.add_request(spec(f"r{i}"), clock.monotonic())

    step = core.schedule(clock.monotonic())

    assert step.request_ids == ["r0", "r1", "r2", "r3"]
    assert (core.num_running, core.num_waiting) == (4, 6)
    clock.advance(step.duration_s)
    core.complete(step, clock.monotonic())
    # Running sequences keep their places; nobody is admitted while the batch is full.
    assert core.schedule(clock.monotonic()).request_ids == ["r0", "r1", "r2", "r3"]


def test_token_budget_chunks_a_prefill_and_the_chunk_yields_no_token() -> None:
    core, clock = EngineCore(make_config(max_num_batched_tokens=100)), ManualClock()
    for i in range(3):
        core.add_request(spec(f"r{i}", prompt=40), clock.monotonic())

    step = core.schedule(clock.monotonic())
    assert step.request_ids == ["r0", "r1", "r2"]
    assert step.prefill_tokens == 100  # 40 + 40 + a 20-token chunk of r2
    clock.advance(step.duration_s)
    outcome = core.complete(step, clock.monotonic())
    assert [t.request_id for t in outcome.tokens] == ["r0", "r1"]

    second = core.schedule(clock.monotonic())
    # r0 and r1 decode (1 token each); r2 prefills its remaining 20 tokens.
    assert (second.decode_tokens, second.prefill_tokens) == (2, 20)
    clock.advance(second.duration_s)
    assert [t.request_id for t in core.complete(second, clock.monotonic()).tokens] == [
        "r0",
        "r1",
        "r2",
    ]


def test_full_kv_cache_keeps_requests_waiting_until_blocks_free_up() -> None:
    # 10 blocks of 16 tokens; each 64-token prompt needs 4 blocks, so two fit and the third waits.
    config = make_config(kv_cache_blocks=10, max_model_len=160)
    core, clock = EngineCore(config), ManualClock()
    for i in range(3):
        core.add_request(spec(f"r{i}", prompt=64, max_tokens=4), clock.monotonic())

    first = core.schedule(clock.monotonic())

    assert first.request_ids == ["r0", "r1"]
    assert (core.num_running, core.num_waiting) == (2, 1)
    assert core.used_blocks == 8
    assert core.kv_cache_usage == pytest.approx(0.8)
    clock.advance(first.duration_s)
    finished_ids = [f.request_id for f in core.complete(first, clock.monotonic()).finished]
    while core.has_work:
        step = core.schedule(clock.monotonic())
        if "r2" in step.request_ids:
            # r2 got in only once r0 and r1 had finished and freed their blocks.
            assert sorted(finished_ids) == ["r0", "r1"]
        else:
            assert core.num_waiting == 1
        clock.advance(step.duration_s)
        finished_ids += [f.request_id for f in core.complete(step, clock.monotonic()).finished]
    assert finished_ids == ["r0", "r1", "r2"]
    assert core.used_blocks == 0


def test_growing_sequences_preempt_the_newest_which_recomputes_and_still_finishes() -> None:
    # 8 blocks = 128 tokens; two sequences of 48 prompt + 64 output (7 blocks each) cannot both
    # grow to full length, so the newer one is preempted and recomputed later.
    config = make_config(kv_cache_blocks=8, max_model_len=128)
    core, clock = EngineCore(config), ManualClock()
    core.add_request(spec("old", prompt=48, max_tokens=64), clock.monotonic())
    core.add_request(spec("new", prompt=48, max_tokens=64), clock.monotonic())

    tokens: list[TokenEmitted] = []
    prompt_tokens_counted = 0
    while core.has_work:
        outcome = run_step(core, clock)
        assert 0 <= core.used_blocks <= 8
        tokens += outcome.tokens
        prompt_tokens_counted += outcome.prompt_tokens

    assert core.preemptions_total >= 1
    assert [t.index for t in tokens if t.request_id == "old"] == list(range(64))
    assert [t.index for t in tokens if t.request_id == "new"] == list(range(64))
    assert core.finished_count(FinishReason.LENGTH) == 2
    # A recomputed prompt is not counted again, as in vLLM.
    assert prompt_tokens_counted == 96


def test_step_time_is_the_linear_model_and_grows_with_the_batch() -> None:
    config = make_config(step_per_context_token_us=1.5)
    core = EngineCore(config)

    assert core.step_duration_s(48, 0, 0) == pytest.approx((2.33 + 48 * 0.104) / 1000)
    assert core.step_duration_s(10, 2000, 500) == pytest.approx(
        (2.33 + 10 * 0.104 + 1.5 * 2000 / 1000 + 20.0 * 500 / 1000) / 1000
    )
    durations = [core.step_duration_s(n, 0, 0) for n in (1, 8, 48, 92)]
    assert durations == sorted(durations)
    assert durations[0] < durations[-1]


def test_a_decode_step_of_eight_sequences_takes_longer_than_one_of_one() -> None:
    def decode_step_duration(batch: int) -> float:
        core, clock = EngineCore(make_config()), ManualClock()
        for i in range(batch):
            core.add_request(spec(f"r{i}", prompt=16, max_tokens=4), clock.monotonic())
        run_step(core, clock)  # the prefill step
        step = core.schedule(clock.monotonic())
        assert step.decode_tokens == batch
        assert step.prefill_tokens == 0
        assert step.context_tokens == batch * 17
        return step.duration_s

    assert decode_step_duration(8) > decode_step_duration(1)


def test_ignore_eos_yields_exactly_max_tokens_and_ends_with_length() -> None:
    core, clock = EngineCore(make_config()), ManualClock()
    core.add_request(spec("a", prompt=100, max_tokens=37), clock.monotonic())
    core.add_request(spec("b", prompt=3, max_tokens=5), clock.monotonic())

    tokens, finished = run_until_idle(core, clock)

    for request_id, count in (("a", 37), ("b", 5)):
        mine = [t for t in tokens if t.request_id == request_id]
        assert [t.index for t in mine] == list(range(count))
        assert [t.finish_reason for t in mine] == [None] * (count - 1) + [FinishReason.LENGTH]
    assert {(f.request_id, f.reason, f.output_tokens) for f in finished} == {
        ("a", FinishReason.LENGTH, 37),
        ("b", FinishReason.LENGTH, 5),
    }


def test_pseudo_eos_ends_requests_with_stop_after_a_geometric_number_of_tokens() -> None:
    # pseudo_eos_max_tokens 9: each token is the EOS with probability 1/5, mean length 5.
    core, clock = EngineCore(make_config(pseudo_eos_max_tokens=9)), ManualClock()
    for i in range(400):
        core.add_request(spec(f"r{i}", max_tokens=60, ignore_eos=False), clock.monotonic())

    tokens, finished = run_until_idle(core, clock)

    lengths = [f.output_tokens for f in finished]
    assert sum(lengths) / len(lengths) == pytest.approx(5.0, rel=0.15)
    assert min(lengths) == 1
    assert max(lengths) > 9  # memoryless: no cap at pseudo_eos_max_tokens
    stopped = [f for f in finished if f.reason is FinishReason.STOP]
    assert len(stopped) == len(finished)  # (4/5)^60: none should reach max_tokens
    last = {t.request_id: t for t in tokens if t.finish_reason is not None}
    assert {t.token_id for t in last.values()} == {EOS_TOKEN_ID}
    assert all(t.token_id != EOS_TOKEN_ID for t in tokens if t.finish_reason is None)


@pytest.mark.parametrize(
    ("min_tokens", "max_tokens"),
    [
        pytest.param(0, 10, id="no-minimum"),
        pytest.param(7, 10, id="minimum-below-max-tokens"),
        pytest.param(10, 10, id="minimum-equal-to-max-tokens"),
    ],
)
def test_min_tokens_holds_the_pseudo_eos_back(min_tokens: int, max_tokens: int) -> None:
    # Every token may be the EOS (mean 1), so each request stops at its first chance.
    core, clock = EngineCore(make_config(pseudo_eos_max_tokens=1)), ManualClock()
    core.add_request(
        spec("r", max_tokens=max_tokens, ignore_eos=False, min_tokens=min_tokens),
        clock.monotonic(),
    )

    _, finished = run_until_idle(core, clock)

    expected = (
        (min_tokens + 1, FinishReason.STOP)
        if min_tokens < max_tokens
        else (max_tokens, FinishReason.LENGTH)
    )
    assert [(f.output_tokens, f.reason) for f in finished] == [expected]


def test_first_token_comes_with_the_prefill_step_then_one_per_step() -> None:
    core, clock = EngineCore(make_config()), ManualClock()
    arrival = clock.monotonic()
    core.add_request(spec("r", prompt=500, max_tokens=3), arrival)
    clock.advance(0.5)  # queued half a second before the engine looks

    first = core.schedule(clock.monotonic())
    clock.advance(first.duration_s)
    (token,) = core.complete(first, clock.monotonic()).tokens

    assert token.index == 0
    assert token.interval_s == pytest.approx(0.5 + first.duration_s)  # TTFT since arrival
    second = core.schedule(clock.monotonic())
    clock.advance(second.duration_s)
    outcome = core.complete(second, clock.monotonic())
    assert [t.interval_s for t in outcome.tokens] == [pytest.approx(second.duration_s)]
    _, finished = run_until_idle(core, clock)
    assert finished[0].queued_s == pytest.approx(0.5)


def test_more_concurrency_gives_more_tokens_per_second_and_slower_requests() -> None:
    def serve(concurrency: int) -> tuple[float, float]:
        """(output tokens per second, mean end-to-end latency) for one wave of requests."""
        core, clock = EngineCore(make_config()), ManualClock()
        start = clock.monotonic()
        for i in range(concurrency):
            core.add_request(spec(f"r{i}", prompt=64, max_tokens=128), start)
        tokens, finished = run_until_idle(core, clock)
        throughput = len(tokens) / (clock.monotonic() - start)
        return throughput, sum(f.e2e_s for f in finished) / len(finished)

    results = [serve(concurrency) for concurrency in (1, 8, 48, 96)]

    throughputs = [throughput for throughput, _ in results]
    latencies = [latency for _, latency in results]
    assert throughputs == sorted(throughputs)
    assert throughputs[-1] > 10 * throughputs[0]
    assert latencies == sorted(latencies)
    assert latencies[-1] > latencies[0]


def test_abort_frees_the_slot_and_blocks_wherever_the_request_is() -> None:
    core, clock = EngineCore(make_config(max_num_seqs=1)), ManualClock()
    core.add_request(spec("running", prompt=64), clock.monotonic())
    core.add_request(spec("waiting", prompt=64), clock.monotonic())
    run_step(core, clock)
    assert core.used_blocks > 0

    waiting = core.abort("waiting", clock.monotonic())
    running = core.abort("running", clock.monotonic())

    assert waiting is not None
    assert waiting.reason is FinishReason.ABORT
    assert waiting.first_scheduled_s is None
    assert running is not None
    assert running.output_tokens == 1
    assert (core.num_running, core.num_waiting, core.used_blocks) == (0, 0, 0)
    assert core.finished_count(FinishReason.ABORT) == 2
    assert core.abort("running", clock.monotonic()) is None
    assert not core.has_work


def test_a_request_aborted_during_its_step_gets_no_token() -> None:
    core, clock = EngineCore(make_config()), ManualClock()
    core.add_request(spec("gone"), clock.monotonic())
    core.add_request(spec("stays"), clock.monotonic())
    step = core.schedule(clock.monotonic())

    core.abort("gone", clock.monotonic())
    clock.advance(step.duration_s)
    outcome = core.complete(step, clock.monotonic())

    assert [t.request_id for t in outcome.tokens] == ["stays"]
    assert outcome.prompt_tokens == 16
    assert core.used_blocks == math.ceil(17 / 16) - 1  # "stays" holds its 16 computed tokens


def test_peak_counts_requests_inside_the_engine_until_reset() -> None:
    core, clock = EngineCore(make_config(max_num_seqs=2)), ManualClock()
    for i in range(5):
        core.add_request(spec(f"r{i}", max_tokens=2), clock.monotonic())
    run_until_idle(core, clock)

    assert core.peak_in_engine == 5
    assert core.reset_peak() == 5
    assert core.peak_in_engine == 0
    core.add_request(spec("later"), clock.monotonic())
    assert core.peak_in_engine == 1


def test_a_step_must_complete_before_the_next_is_scheduled() -> None:
    core, clock = EngineCore(make_config()), ManualClock()
    core.add_request(spec("r"), clock.monotonic())
    step = core.schedule(clock.monotonic())

    with pytest.raises(RuntimeError, match="not completed"):
        core.schedule(clock.monotonic())
    core.complete(step, clock.monotonic())
    with pytest.raises(RuntimeError, match="not the step in flight"):
        core.complete(step, clock.monotonic())


@pytest.mark.parametrize(
    ("request_spec", "message"),
    [
        pytest.param(spec("r", prompt=4000, max_tokens=97), "max_model_len", id="too-long"),
        pytest.param(spec("r", prompt=0), "at least one", id="empty-prompt"),
        pytest.param(spec("r", max_tokens=0), "at least one", id="no-output"),
        pytest.param(spec("r", max_tokens=4, min_tokens=5), "min_tokens", id="min-above-max"),
    ],
)
def test_requests_that_could_never_run_are_refused(request_spec: RequestSpec, message: str) -> None:
    core = EngineCore(make_config())
    with pytest.raises(ValueError, match=message):
        core.add_request(request_spec, 0.0)


def test_a_request_id_is_unique_while_in_the_engine() -> None:
    core = EngineCore(make_config())
    core.add_request(spec("r"), 0.0)
    with pytest.raises(ValueError, match="already"):
        core.add_request(spec("r"), 0.0)


def test_an_idle_engine_schedules_an_empty_free_step() -> None:
    core, clock = EngineCore(make_config()), ManualClock()
    step = core.schedule(clock.monotonic())
    assert step.is_empty
    assert step.duration_s == 0.0
    assert core.complete(step, clock.monotonic()) == StepOutcome()
    assert core.steps_total == 0


def test_a_step_dated_before_a_requests_arrival_does_not_make_its_queue_time_negative() -> None:
    core = EngineCore(make_config())
    core.add_request(spec("r", max_tokens=1), now_s=10.0)

    step = core.schedule(now_s=9.99)
    (finished,) = core.complete(step, now_s=10.01).finished

    assert finished.queued_s == 0.0
