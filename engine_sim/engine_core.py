"""A pure model of vLLM V1's continuous batching: scheduler, KV-cache blocks and step cost.

No asyncio and no clock: the caller passes the time in. One engine step is two calls:
`schedule(now)` decides what the step computes and how long it takes; the caller lets that time
pass (the async driver sleeps, a test advances a ManualClock) and calls `complete(step, now)`,
which emits the step's tokens and finishes the sequences that are done.

The scheduler follows vLLM V1's, reduced to what shapes latency and throughput:
- Each sequence tracks its computed tokens against its tokens so far (prompt + output). A step
  gives each scheduled sequence up to that difference, within the step's token budget
  (max_num_batched_tokens): a decoding sequence takes 1 token, a prefilling one the rest of its
  prompt or a chunk of it (chunked prefill). The step that computes a sequence's last pending
  token samples its next output token: the prefill step yields the first token, then one token
  per step.
- Running sequences are served first, in admission order; then waiting ones, first come first
  served, while fewer than max_num_seqs run, budget is left and their blocks fit. A waiting
  request that does not fit blocks those behind it (no overtaking), as in vLLM.
- KV blocks: a sequence holds ceil(computed tokens / block_size) blocks, allocated when a step is
  scheduled. When a running sequence cannot grow, the newest running sequence is preempted: its
  blocks are freed, it returns to the front of the waiting queue and later recomputes its prompt
  and the output produced so far. No new request is admitted in a step that preempted.
- Step time = step_base_ms + step_per_seq_ms x sequences + step_per_context_token_us x context
  tokens / 1000 + step_per_prefill_token_us x prefill tokens / 1000, where context tokens are the
  tokens the scheduled sequences hold after the step and prefill tokens those computed for
  sequences that are not simply decoding. The costs and limits come from the configured profile
  (engine_sim/profiles.py) with the config's overrides.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from engine_sim.profiles import EngineProfile, effective_profile
from slotshift.config import EngineSimConfig


class FinishReason(StrEnum):
    """Why a request ended; the values are vLLM's `finished_reason` label values
    (vllm/v1/engine/__init__.py), each of which its /metrics shows from the start. The emulator
    ends requests with the first three only: it has no engine errors and no repetition detection."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    REPETITION = "repetition"


@dataclass(frozen=True)
class RequestSpec:
    """A request as the engine sees it: token counts, not text."""

    request_id: str
    prompt_tokens: int
    max_output_tokens: int
    stop_after_tokens: int | None
    """Output tokens after which the request ends by itself (pseudo-EOS); None for ignore_eos."""


@dataclass(frozen=True)
class TokenEmitted:
    """One output token sampled at the end of a step."""

    request_id: str
    index: int
    """0-based position in the output."""
    time_s: float
    interval_s: float
    """Since the previous token, or for the first token since arrival (its TTFT)."""
    finish_reason: FinishReason | None
    """Set on the request's last token: why the request ends with it."""


@dataclass(frozen=True)
class FinishedRequest:
    """A request that left the engine, with the times vLLM's request metrics are made of."""

    request_id: str
    reason: FinishReason
    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    first_scheduled_s: float | None
    """None when it was aborted before ever being scheduled."""
    finished_s: float

    @property
    def e2e_s(self) -> float:
        return self.finished_s - self.arrival_s

    @property
    def queued_s(self) -> float | None:
        if self.first_scheduled_s is None:
            return None
        return self.first_scheduled_s - self.arrival_s


@dataclass
class _Sequence:
    spec: RequestSpec
    arrival_s: float
    num_computed_tokens: int = 0
    output_tokens: int = 0
    blocks: int = 0
    first_scheduled_s: float | None = None
    last_token_s: float | None = None
    done: bool = False

    @property
    def num_tokens(self) -> int:
        return self.spec.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class _Scheduled:
    sequence: _Sequence
    new_tokens: int


@dataclass(frozen=True)
class ScheduledStep:
    """What one step computes and what it costs."""

    step_id: int
    started_s: float
    entries: tuple[_Scheduled, ...]
    prefill_tokens: int
    decode_tokens: int
    context_tokens: int
    preemptions: int
    duration_s: float

    @property
    def num_seqs(self) -> int:
        return len(self.entries)

    @property
    def request_ids(self) -> list[str]:
        """The scheduled requests, in batch order."""
        return [entry.sequence.spec.request_id for entry in self.entries]

    @property
    def is_empty(self) -> bool:
        return not self.entries


@dataclass(frozen=True)
class StepOutcome:
    """What a completed step produced."""

    tokens: list[TokenEmitted] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
    prompt_tokens: int = 0
    """Prompt tokens of the requests that got their first token in this step (vLLM counts a
    prompt once, when its prefill yields the first token, however often it was recomputed)."""


class EngineCore:
    """The scheduler and KV cache of one emulated engine (see the module docstring)."""

    def __init__(self, config: EngineSimConfig) -> None:
        self._config = config
        self._profile = effective_profile(config)
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._free_blocks = self._profile.kv_cache_blocks
        self._in_flight: ScheduledStep | None = None
        self._next_step_id = 0
        self._peak_in_engine = 0
        self._finished_counts = dict.fromkeys(FinishReason, 0)
        self._preemptions_total = 0
        self._steps_total = 0

    # --- state -----------------------------------------------------------------------------

    @property
    def profile(self) -> EngineProfile:
        """The effective profile: the configured one with the config's overrides."""
        return self._profile

    @property
    def num_running(self) -> int:
        """Sequences in the running batch (vLLM's num_requests_running)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission, preempted ones included (num_requests_waiting)."""
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def peak_in_engine(self) -> int:
        """Most requests running plus waiting at once since start or the last reset_peak()."""
        return self._peak_in_engine

    def reset_peak(self) -> None:
        """Start a new peak measurement from the current number of requests."""
        self._peak_in_engine = len(self._by_id)

    @property
    def used_blocks(self) -> int:
        return self._profile.kv_cache_blocks - self._free_blocks

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use, 0 to 1 (vLLM's kv_cache_usage_perc)."""
        return self.used_blocks / self._profile.kv_cache_blocks

    def finished_count(self, reason: FinishReason) -> int:
        """Requests that ended for `reason` since start."""
        return self._finished_counts[reason]

    @property
    def preemptions_total(self) -> int:
        return self._preemptions_total

    @property
    def steps_total(self) -> int:
        return self._steps_total

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    # --- requests --------------------------------------------------------------------------

    def add_request(self, spec: RequestSpec, now_s: float) -> None:
        """Queue a request; ValueError if it could never run (the API validates before)."""
        if spec.request_id in self._by_id:
            raise ValueError(f"request {spec.request_id} is already in the engine")
        if spec.prompt_tokens < 1 or spec.max_output_tokens < 1:
            raise ValueError("a request needs at least one prompt and one output token")
        if spec.prompt_tokens + spec.max_output_tokens > self._config.max_model_len:
            raise ValueError(
                f"{spec.prompt_tokens} prompt + {spec.max_output_tokens} output tokens exceed "
                f"max_model_len {self._config.max_model_len}"
            )
        sequence = _Sequence(spec=spec, arrival_s=now_s)
        self._by_id[spec.request_id] = sequence
        self._waiting.append(sequence)
        self._peak_in_engine = max(self._peak_in_engine, len(self._by_id))

    def abort(self, request_id: str, now_s: float) -> FinishedRequest | None:
        """Remove a request wherever it is; None if it is not in the engine (already done)."""
        sequence = self._by_id.get(request_id)
        if sequence is None:
            return None
        if sequence in self._running:
            self._running.remove(sequence)
        else:
            self._waiting.remove(sequence)
        return self._finish(sequence, FinishReason.ABORT, now_s)

    # --- steps -----------------------------------------------------------------------------

    def schedule(self, now_s: float) -> ScheduledStep:
        """Decide the next step; the caller lets duration_s pass, then calls complete()."""
        if self._in_flight is not None:
            raise RuntimeError("the previous step has not completed")
        budget = self._profile.max_num_batched_tokens
        entries: list[_Scheduled] = []
        preemptions = 0

        index = 0
        while index < len(self._running) and budget > 0:
            sequence = self._running[index]
            new_tokens = min(sequence.num_tokens - sequence.num_computed_tokens, budget)
            needed = self._blocks_for(sequence.num_computed_tokens + new_tokens) - sequence.blocks
            preempted_self = False
            while needed > self._free_blocks:
                victim = self._running.pop()
                self._preempt(victim)
                preemptions += 1
                if victim is sequence:
                    preempted_self = True
                    break
            if preempted_self:
                break
            self._allocate(sequence, needed)
            entries.append(_Scheduled(sequence, new_tokens))
            budget -= new_tokens
            index += 1

        if preemptions == 0:
            while self._waiting and budget > 0 and len(self._running) < self._profile.max_num_seqs:
                sequence = self._waiting[0]
                new_tokens = min(sequence.num_tokens - sequence.num_computed_tokens, budget)
                needed = self._blocks_for(new_tokens)
                if needed > self._free_blocks:
                    break
                self._waiting.popleft()
                self._allocate(sequence, needed)
                self._running.append(sequence)
                if sequence.first_scheduled_s is None:
                    # The driver may date a step a little before the present (it keeps steps
                    # back to back); a request that arrived since was not queued before it.
                    sequence.first_scheduled_s = max(now_s, sequence.arrival_s)
                entries.append(_Scheduled(sequence, new_tokens))
                budget -= new_tokens

        decode_tokens = sum(1 for entry in entries if self._is_decode(entry))
        prefill_tokens = sum(entry.new_tokens for entry in entries if not self._is_decode(entry))
        context_tokens = sum(e.sequence.num_computed_tokens + e.new_tokens for e in entries)
        step = ScheduledStep(
            step_id=self._next_step_id,
            started_s=now_s,
            entries=tuple(entries),
            prefill_tokens=prefill_tokens,
            decode_tokens=decode_tokens,
            context_tokens=context_tokens,
            preemptions=preemptions,
            duration_s=self.step_duration_s(len(entries), context_tokens, prefill_tokens)
            if entries
            else 0.0,
        )
        self._next_step_id += 1
        self._preemptions_total += preemptions
        self._in_flight = step
        return step

    def complete(self, step: ScheduledStep, now_s: float) -> StepOutcome:
        """Finish `step` at now_s: advance its sequences, sample tokens, end finished requests."""
        if self._in_flight is not step:
            raise RuntimeError(f"step {step.step_id} is not the step in flight")
        self._in_flight = None
        if not step.is_empty:
            self._steps_total += 1
        tokens: list[TokenEmitted] = []
        finished: list[FinishedRequest] = []
        prompt_tokens = 0
        for entry in step.entries:
            sequence = entry.sequence
            if sequence.done:  # aborted while the step ran
                continue
            sequence.num_computed_tokens += entry.new_tokens
            if sequence.num_computed_tokens < sequence.num_tokens:
                continue  # a prefill chunk; no token yet
            index = sequence.output_tokens
            previous_s = sequence.last_token_s
            if previous_s is None:
                previous_s = sequence.arrival_s
            sequence.output_tokens += 1
            sequence.last_token_s = now_s
            if index == 0:
                prompt_tokens += sequence.spec.prompt_tokens
            reason = self._finish_reason(sequence)
            tokens.append(
                TokenEmitted(sequence.spec.request_id, index, now_s, now_s - previous_s, reason)
            )
            if reason is not None:
                self._running.remove(sequence)
                finished.append(self._finish(sequence, reason, now_s))
        return StepOutcome(tokens=tokens, finished=finished, prompt_tokens=prompt_tokens)

    def step_duration_s(self, num_seqs: int, context_tokens: int, prefill_tokens: int) -> float:
        """Seconds a step takes with this batch (the step-time model)."""
        return self._profile.step.step_ms(num_seqs, context_tokens, prefill_tokens) / 1000.0

    # --- internals -------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self._config.block_size_tokens)

    def _allocate(self, sequence: _Sequence, blocks: int) -> None:
        if blocks > 0:
            self._free_blocks -= blocks
            sequence.blocks += blocks

    def _release(self, sequence: _Sequence) -> None:
        self._free_blocks += sequence.blocks
        sequence.blocks = 0

    def _preempt(self, sequence: _Sequence) -> None:
        self._release(sequence)
        sequence.num_computed_tokens = 0
        self._waiting.appendleft(sequence)

    @staticmethod
    def _is_decode(entry: _Scheduled) -> bool:
        sequence = entry.sequence
        return (
            entry.new_tokens == 1
            and sequence.output_tokens > 0
            and sequence.num_computed_tokens == sequence.num_tokens - 1
        )

    @staticmethod
    def _finish_reason(sequence: _Sequence) -> FinishReason | None:
        stop_after = sequence.spec.stop_after_tokens
        if stop_after is not None and sequence.output_tokens >= stop_after:
            # vLLM reports "stop" when EOS is sampled, even on the max_tokens-th token.
            return FinishReason.STOP
        if sequence.output_tokens >= sequence.spec.max_output_tokens:
            return FinishReason.LENGTH
        return None

    def _finish(self, sequence: _Sequence, reason: FinishReason, now_s: float) -> FinishedRequest:
        sequence.done = True
        self._release(sequence)
        del self._by_id[sequence.spec.request_id]
        self._finished_counts[reason] += 1
        return FinishedRequest(
            request_id=sequence.spec.request_id,
            reason=reason,
            prompt_tokens=sequence.spec.prompt_tokens,
            output_tokens=sequence.output_tokens,
            arrival_s=sequence.arrival_s,
            first_scheduled_s=sequence.first_scheduled_s,
            finished_s=now_s,
        )
