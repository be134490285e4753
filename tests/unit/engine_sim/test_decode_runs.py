"""EngineCore.advance_decodes against stepping: the same engine, the same requests, the same
figures, whether its decode-only stretches are run step by step or jumped over at once."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from engine_sim.engine_core import EngineCore, FinishedRequest, RequestSpec
from slotshift.config import EngineSimConfig


@dataclass
class Record:
    """What a driver saw of the engine."""

    tokens: dict[str, list[float]] = field(default_factory=dict)
    finished: list[FinishedRequest] = field(default_factory=list)
    jumped_steps: int = 0


def _arrivals(seed: int, count: int) -> list[tuple[float, RequestSpec]]:
    rng = random.Random(seed)
    shared = tuple(rng.randrange(1000, 30000) for _ in range(48))
    arrivals = []
    t = 0.0
    for index in range(count):
        t += rng.expovariate(40.0)
        # Some prompts share a prefix (prefix-cache hits), some stop at a pseudo-EOS.
        prefix = shared if rng.random() < 0.3 else ()
        prompt = prefix + tuple(rng.randrange(1000, 30000) for _ in range(rng.randint(1, 90)))
        max_output_tokens = rng.randint(1, 200)
        spec = RequestSpec(
            f"r{index}",
            prompt,
            max_output_tokens=max_output_tokens,
            ignore_eos=rng.random() < 0.7,
            min_tokens=rng.randint(0, min(3, max_output_tokens)),
        )
        arrivals.append((t, spec))
    return arrivals


def _drive(
    config: EngineSimConfig, arrivals: list[tuple[float, RequestSpec]], jump: bool
) -> Record:
    core = EngineCore(config)
    record = Record()
    pending = list(arrivals)
    now = 0.0
    while pending or core.has_work:
        if not core.has_work:
            now = max(now, pending[0][0])
        while pending and pending[0][0] <= now:
            t, spec = pending.pop(0)
            core.add_request(spec, t)
        if not core.has_work:
            continue
        if jump:
            until = pending[0][0] if pending else float("inf")
            run = core.advance_decodes(now, until)
            if run is not None:
                record.jumped_steps += run.steps
                for request_id in run.request_ids:
                    record.tokens.setdefault(request_id, []).extend(run.ends_s)
                record.finished += run.finished
                now = run.ends_s[-1]
                continue
        step = core.schedule(now)
        now += step.duration_s
        outcome = core.complete(step, now)
        for token in outcome.tokens:
            record.tokens.setdefault(token.request_id, []).append(token.time_s)
        record.finished += outcome.finished
    assert core.num_in_engine == 0
    return record


@pytest.mark.parametrize(
    ("seed", "kv_cache_blocks", "least_jumped"),
    [
        pytest.param(1, None, 1000, id="roomy-cache"),
        # Requests wait for blocks most of the time: few stretches qualify, and those that do
        # end where a preemption would begin.
        pytest.param(2, 64, 100, id="tight-cache-preempts"),
        pytest.param(3, 100, 500, id="evicting-cache"),
    ],
)
def test_jumping_gives_what_stepping_gives(
    seed: int, kv_cache_blocks: int | None, least_jumped: int
) -> None:
    config = EngineSimConfig(kv_cache_blocks=kv_cache_blocks, max_model_len=512)
    arrivals = _arrivals(seed, 300)
    stepped = _drive(config, arrivals, jump=False)
    jumped = _drive(config, arrivals, jump=True)
    assert jumped.jumped_steps >= least_jumped  # the runs did the work, not the fallback
    assert jumped.finished == stepped.finished
    assert jumped.tokens.keys() == stepped.tokens.keys()
    for request_id, times in stepped.tokens.items():
        # The same steps, their durations summed in another order at most.
        assert jumped.tokens[request_id] == pytest.approx(times, rel=1e-12, abs=1e-9)


def test_no_run_while_a_request_waits_or_prefills() -> None:
    core = EngineCore(EngineSimConfig())
    core.add_request(RequestSpec("a", (5, 6, 7), max_output_tokens=10, ignore_eos=True), 0.0)
    assert core.advance_decodes(0.0, 10.0) is None  # waiting for admission
    step = core.schedule(0.0)
    assert core.advance_decodes(0.0, 10.0) is None  # a step in flight
    core.complete(step, step.duration_s)
    run = core.advance_decodes(step.duration_s, 10.0)
    assert run is not None
    assert run.steps == 9  # the prefill gave the first token; the ninth decode ends it
    assert [f.request_id for f in run.finished] == ["a"]
    assert core.advance_decodes(run.ends_s[-1], 10.0) is None  # nothing left


def test_a_run_ends_before_the_deadline() -> None:
    core = EngineCore(EngineSimConfig())
    core.add_request(RequestSpec("a", (5, 6, 7), max_output_tokens=1000, ignore_eos=True), 0.0)
    step = core.schedule(0.0)
    core.complete(step, step.duration_s)
    run = core.advance_decodes(step.duration_s, 0.1)
    assert run is not None
    assert run.ends_s[-1] < 0.1
    assert not run.finished
    following = core.schedule(run.ends_s[-1])
    assert run.ends_s[-1] + following.duration_s >= 0.1
