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
  and the output produced so far (what the prefix cache still holds of it excepted). No new
  request is admitted in a step that preempted.
- Prefix caching (vLLM V1's automatic prefix caching, on unless enable_prefix_caching is false):
  a full block is named by the context hash at its end (engine_sim/tokens.py), which chains every
  token before it. Once computed, a full block is shared: a request admitted later whose leading
  full blocks are cached starts with those tokens computed (never its last prompt token: at least
  one token is computed, as vLLM needs its logits), and they are not prefill work. Blocks of
  requests that finished, were aborted or preempted stay cached while unreferenced, evictable in
  least-recently-freed order (a request's last block first): allocation takes never-used free
  blocks first, then evicts. vLLM counts a request's lookup once, when it is first admitted
  (vllm:prefix_cache_queries and vllm:prefix_cache_hits, in tokens; a preempted request's
  re-admission is in neither); the tokens then found cached are its usage's cached_tokens.
- Tokens: each sampled token is a function of the request's context (tokens.py), so a request
  whose prompt is another's prompt plus its first k output tokens generates that other's output
  from token k on, EOS included (given min_tokens and max_tokens reduced by k).
- Step time = step_base_ms + step_per_seq_ms x sequences + step_per_context_token_us x context
  tokens / 1000 + step_per_prefill_token_us x prefill tokens / 1000, where context tokens are the
  tokens the scheduled sequences hold after the step and prefill tokens those computed for
  sequences that are not simply decoding. The costs and limits come from the configured profile
  (engine_sim/profiles.py) with the config's overrides.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from engine_sim.profiles import EngineProfile, effective_profile
from engine_sim.tokens import (
    CONTEXT_HASH_START,
    EOS_TOKEN_ID,
    context_hash,
    eos_sampled,
    eos_threshold,
    extend_hash,
    next_token_id,
    ordinary_chains,
    pseudo_eos_mean_tokens,
    sample_ordinary,
)
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
    """A request as the engine sees it: token ids, not text."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_output_tokens: int
    ignore_eos: bool = False
    """Never sample the pseudo-EOS: the request ends after exactly max_output_tokens."""
    min_tokens: int = 0
    """Output tokens before which the pseudo-EOS is not sampled (vLLM's min_tokens)."""

    @property
    def prompt_tokens(self) -> int:
        """How many prompt tokens it has."""
        return len(self.prompt_token_ids)


@dataclass(slots=True)
class TokenEmitted:
    """One output token sampled at the end of a step; read-only by convention. Not frozen:
    one is built per token stepped, and a frozen dataclass costs four times as much to build."""

    request_id: str
    index: int
    """0-based position in the output."""
    token_id: int
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
    cached_tokens: int = 0
    """Prompt tokens the prefix cache held when it was first admitted (vLLM's
    num_cached_tokens); 0 when it was never admitted."""
    cache_creation_tokens: int = 0
    """Prompt tokens it computed into full blocks that went into the prefix cache, taken at its
    first token (vLLM's num_cache_creation_tokens)."""

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
    prompt_tokens: int
    """len(spec.prompt_token_ids), kept: it is read for every sequence at every step."""
    arrival_s: float
    context_hash: int
    """Of every token so far, prompt and output."""
    block_keys: list[int]
    """The context hash at the end of each full block of its tokens so far."""
    num_computed_tokens: int = 0
    output_tokens: int = 0
    shared_keys: list[int] = field(default_factory=list)
    """Keys of the cached blocks it holds: always its leading blocks (block_keys' prefix)."""
    private_blocks: int = 0
    """Blocks it holds that are not in the cache (the partial last one, or all without caching)."""
    first_scheduled_s: float | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int = 0
    preempted: bool = False
    last_token_s: float | None = None
    done: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def blocks(self) -> int:
        return len(self.shared_keys) + self.private_blocks


class _Scheduled(NamedTuple):
    # A tuple: one is built per sequence and step.
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
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache by requests first admitted in this step."""
    prefix_cache_hits: int = 0
    """Of those, the tokens found cached."""

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
class DecodeRun:
    """Decode steps run back to back by EngineCore.advance_decodes: every request of the batch
    got one token at the end of each step."""

    started_s: float
    ends_s: tuple[float, ...]
    """When each step ended (when its tokens were sampled), in order."""
    request_ids: tuple[str, ...]
    """The batch, in batch order."""
    finished: list[FinishedRequest]
    """The requests that ended with the last step."""

    @property
    def steps(self) -> int:
        return len(self.ends_s)


@dataclass(frozen=True)
class StepOutcome:
    """What a completed step produced."""

    tokens: list[TokenEmitted] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
    prompt_tokens: int = 0
    """Prompt tokens of the requests that got their first token in this step (vLLM counts a
    prompt once, when its prefill yields the first token, however often it was recomputed)."""


class EngineCore:
    """The scheduler, KV cache and prefix cache of one emulated engine (see the module docstring)."""

    def __init__(self, config: EngineSimConfig) -> None:
        self._config = config
        self._profile = effective_profile(config)
        self._block_size = config.block_size_tokens
        self._caching = config.enable_prefix_caching
        self._eos_threshold = eos_threshold(pseudo_eos_mean_tokens(config.pseudo_eos_max_tokens))
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._free_blocks = self._profile.kv_cache_blocks
        """Never-used (or uncached) free blocks; evictable cached blocks are counted apart."""
        self._evictable: OrderedDict[int, None] = OrderedDict()
        """Cached blocks no request holds, least recently freed first."""
        self._in_use: dict[int, int] = {}
        """Cached blocks requests hold, by key, with how many hold each."""
        self._in_flight: ScheduledStep | None = None
        self._next_step_id = 0
        self._peak_in_engine = 0
        self._finished_counts = dict.fromkeys(FinishReason, 0)
        self._preemptions_total = 0
        self._steps_total = 0
        self._prefix_cache_queries_total = 0
        self._prefix_cache_hits_total = 0

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
    def num_in_engine(self) -> int:
        """Requests inside the engine now: running plus waiting."""
        return len(self._by_id)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def peak_in_engine(self) -> int:
        """Most requests running plus waiting at once since start or the last reset_peak(), taken
        at every add_request() and every schedule(): an exact high-water mark, not a sample."""
        return self._peak_in_engine

    def reset_peak(self) -> int:
        """Start a new peak measurement from the current number of requests; returns the peak
        that ended."""
        ended = self._peak_in_engine
        self._peak_in_engine = len(self._by_id)
        return ended

    @property
    def used_blocks(self) -> int:
        """Blocks requests hold (evictable cached blocks are free, as vLLM counts them)."""
        return self._profile.kv_cache_blocks - self._free_blocks - len(self._evictable)

    @property
    def cached_blocks(self) -> int:
        """Blocks the prefix cache names, held or evictable."""
        return len(self._in_use) + len(self._evictable)

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

    @property
    def prefix_cache_queries_total(self) -> int:
        """Prompt tokens looked up at first admission since start (vLLM's counter's value)."""
        return self._prefix_cache_queries_total

    @property
    def prefix_cache_hits_total(self) -> int:
        """Of those, the tokens found cached."""
        return self._prefix_cache_hits_total

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    # --- requests --------------------------------------------------------------------------

    def add_request(self, spec: RequestSpec, now_s: float) -> None:
        """Queue a request; ValueError if it could never run (the API validates before)."""
        if spec.request_id in self._by_id:
            raise ValueError(f"request {spec.request_id} is already in the engine")
        if spec.prompt_tokens < 1 or spec.max_output_tokens < 1:
            raise ValueError("a request needs at least one prompt and one output token")
        if not 0 <= spec.min_tokens <= spec.max_output_tokens:
            raise ValueError("min_tokens must lie between 0 and max_output_tokens")
        if spec.prompt_tokens + spec.max_output_tokens > self._config.max_model_len:
            raise ValueError(
                f"{spec.prompt_tokens} prompt + {spec.max_output_tokens} output tokens exceed "
                f"max_model_len {self._config.max_model_len}"
            )
        state = CONTEXT_HASH_START
        keys: list[int] = []
        ids = spec.prompt_token_ids
        size = self._block_size
        for start in range(0, len(ids) - size + 1, size):
            state = context_hash(ids[start : start + size], state)
            keys.append(state)
        state = context_hash(ids[len(keys) * size :], state)
        sequence = _Sequence(
            spec=spec,
            prompt_tokens=len(ids),
            arrival_s=now_s,
            context_hash=state,
            block_keys=keys,
        )
        self._by_id[spec.request_id] = sequence
        self._waiting.append(sequence)
        self._peak_in_engine = max(self._peak_in_engine, len(self._by_id))

    def abort(self, request_id: str, now_s: float) -> FinishedRequest | None:
        """Remove a request wherever it is; None if it is not in the engine (already done). Its
        computed full blocks stay in the prefix cache."""
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
        self._peak_in_engine = max(self._peak_in_engine, len(self._by_id))
        budget = self._profile.max_num_batched_tokens
        entries: list[_Scheduled] = []
        preemptions = 0
        queries = hits = 0

        # The running batch is walked once per step: its per-sequence work is written out
        # (what _blocks_for, _allocatable and the properties compute) rather than called.
        running = self._running
        size = self._block_size
        index = 0
        while index < len(running) and budget > 0:
            sequence = running[index]
            computed = sequence.num_computed_tokens
            new_tokens = min(sequence.prompt_tokens + sequence.output_tokens - computed, budget)
            needed = (
                -(-(computed + new_tokens) // size)
                - len(sequence.shared_keys)
                - sequence.private_blocks
            )
            if needed > 0:
                preempted_self = False
                while needed > self._free_blocks + len(self._evictable):
                    victim = running.pop()
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
                hit_keys = self._cache_hit(sequence)
                computed = len(hit_keys) * self._block_size
                new_tokens = min(sequence.num_tokens - computed, budget)
                needed = self._blocks_for(computed + new_tokens) - len(hit_keys)
                # Evictable hits are taken out of the free pool, so they cannot also be allocated.
                revived = sum(1 for key in hit_keys if key in self._evictable)
                if needed > self._allocatable() - revived:
                    break
                self._waiting.popleft()
                for key in hit_keys:
                    self._hold_cached(key)
                sequence.shared_keys = hit_keys
                sequence.num_computed_tokens = computed
                self._allocate(sequence, needed)
                self._running.append(sequence)
                if sequence.cached_tokens is None:
                    sequence.cached_tokens = computed
                if self._caching and not sequence.preempted:
                    queries += sequence.num_tokens
                    hits += computed
                if sequence.first_scheduled_s is None:
                    # The driver may date a step a little before the present (it keeps steps
                    # back to back); a request that arrived since was not queued before it.
                    sequence.first_scheduled_s = max(now_s, sequence.arrival_s)
                entries.append(_Scheduled(sequence, new_tokens))
                budget -= new_tokens

        decode_tokens = prefill_tokens = context_tokens = 0
        for sequence, new_tokens in entries:
            computed = sequence.num_computed_tokens
            context_tokens += computed + new_tokens
            # Decoding: one token, the one after the last computed, of a sequence with output.
            if (
                new_tokens == 1
                and sequence.output_tokens > 0
                and computed == sequence.prompt_tokens + sequence.output_tokens - 1
            ):
                decode_tokens += 1
            else:
                prefill_tokens += new_tokens
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
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
        )
        self._next_step_id += 1
        self._preemptions_total += preemptions
        self._prefix_cache_queries_total += queries
        self._prefix_cache_hits_total += hits
        self._in_flight = step
        return step

    def complete(self, step: ScheduledStep, now_s: float) -> StepOutcome:
        """Finish `step` at now_s: advance its sequences, cache their newly full blocks, sample
        tokens, end finished requests."""
        if self._in_flight is not step:
            raise RuntimeError(f"step {step.step_id} is not the step in flight")
        self._in_flight = None
        if not step.is_empty:
            self._steps_total += 1
        tokens: list[TokenEmitted] = []
        finished: list[FinishedRequest] = []
        prompt_tokens = 0
        size = self._block_size
        caching = self._caching
        # A token is a function of its sequence's context alone: those of the sequences that
        # sample without an EOS draw are drawn for the whole batch at once, then taken in
        # batch order below (where each sequence's blocks change in stepping's order).
        drawing = [
            sequence
            for sequence, new_tokens in step.entries
            if not sequence.done
            and sequence.spec.ignore_eos
            and sequence.num_computed_tokens + new_tokens
            >= sequence.prompt_tokens + sequence.output_tokens
        ]
        drawn_ids, drawn_states = sample_ordinary([s.context_hash for s in drawing])
        drawn = 0
        for sequence, new_tokens in step.entries:
            if sequence.done:  # aborted while the step ran
                continue
            computed = sequence.num_computed_tokens + new_tokens
            sequence.num_computed_tokens = computed
            if caching and computed // size > len(sequence.shared_keys):
                self._cache_full_blocks(sequence)  # a block became full
            if computed < sequence.prompt_tokens + sequence.output_tokens:
                continue  # a prefill chunk; no token yet
            index = sequence.output_tokens
            previous_s = sequence.last_token_s
            if previous_s is None:
                previous_s = sequence.arrival_s
            if sequence.spec.ignore_eos:
                token_id = drawn_ids[drawn]
                reason = self._append_token(sequence, token_id, drawn_states[drawn], stops=False)
                drawn += 1
            else:
                token_id, reason = self._sample(sequence)
            sequence.last_token_s = now_s
            if index == 0:
                prompt_tokens += sequence.spec.prompt_tokens
                cached_prompt = min(
                    len(sequence.shared_keys) * self._block_size, sequence.spec.prompt_tokens
                )
                sequence.cache_creation_tokens = max(
                    0, cached_prompt - (sequence.cached_tokens or 0)
                )
            tokens.append(
                TokenEmitted(
                    sequence.spec.request_id, index, token_id, now_s, now_s - previous_s, reason
                )
            )
            if reason is not None:
                self._running.remove(sequence)
                finished.append(self._finish(sequence, reason, now_s))
        return StepOutcome(tokens=tokens, finished=finished, prompt_tokens=prompt_tokens)

    def step_duration_s(self, num_seqs: int, context_tokens: int, prefill_tokens: int) -> float:
        """Seconds a step takes with this batch (the step-time model)."""
        return self._profile.step.step_ms(num_seqs, context_tokens, prefill_tokens) / 1000.0

    def advance_decodes(self, started_s: float, until_s: float) -> DecodeRun | None:
        """Run, back to back from `started_s`, the steps that end before `until_s` in which the
        batch only decodes, all at once: exactly what schedule() and complete() would do step by
        step (the same tokens, times, KV and prefix-cache state, counters), without building
        each step. None, changing nothing, when not even one such step can run now.

        A step qualifies while no step is in flight, nothing waits for admission, every running
        sequence is decoding (one token each, within the token budget) and the KV blocks the
        steps take fit in what is free now (so that none preempts). The run stops after the
        first step that finishes a request (its length or a sampled EOS): the next step's batch
        differs. Callers jump from event to event with it: until_s is when something outside
        may next add or abort a request (tests/unit/engine_sim/test_engine_core.py compares it
        with stepping).
        """
        running = self._running
        if self._in_flight is not None or self._waiting or not running:
            return None
        batch = len(running)
        if batch > self._profile.max_num_batched_tokens:
            return None
        size = self._block_size
        phases = [0] * size
        """Sequences by computed tokens modulo the block size: those with phase r take a new
        block in step j exactly when (r + j) % size == 0."""
        context = 0
        steps = self._profile.max_num_batched_tokens  # an upper bound, lowered below
        for sequence in running:
            computed = sequence.num_computed_tokens
            if sequence.output_tokens == 0 or computed != sequence.num_tokens - 1:
                return None  # prefilling (or recomputing after a preemption)
            phases[computed % size] += 1
            context += computed
            steps = min(steps, sequence.spec.max_output_tokens - sequence.output_tokens)
        ends: list[float] = []
        allocatable = self._allocatable()
        needed = 0
        end_s = started_s
        while len(ends) < steps:
            needed += phases[-len(ends) % size]
            if needed > allocatable:
                break  # the step might preempt: schedule() decides it
            context += batch
            end_s += self.step_duration_s(batch, context, 0)
            if end_s >= until_s:
                break
            ends.append(end_s)
        if not ends:
            return None
        # A sampled EOS ends a request early: the run stops at the first one.
        count = len(ends)
        for sequence in running:
            if sequence.spec.ignore_eos:
                continue
            state, output = sequence.context_hash, sequence.output_tokens
            for index in range(count):
                token_id, stops = self._draw(sequence.spec, state, output + index)
                if stops:
                    count = index + 1
                    break
                state = extend_hash(state, token_id)
        del ends[count:]
        return self._commit_decodes(started_s, ends)

    def _commit_decodes(self, started_s: float, ends: list[float]) -> DecodeRun:
        """Apply advance_decodes' steps in stepping's order: each step's blocks are allocated,
        then each sequence caches its newly full block, as schedule() and complete() do; the
        tokens, which touch no shared state, are sampled sequence by sequence."""
        running = list(self._running)
        size = self._block_size
        start = [sequence.num_computed_tokens for sequence in running]
        steps = len(ends)
        # _sample's rounds at once for the sequences without an EOS draw (ordinary tokens; the
        # run stops at the step that reaches a max_output_tokens, so only that one can end a
        # request); one by one for the others.
        chained = [sequence for sequence in running if sequence.spec.ignore_eos]
        states = ordinary_chains(
            [sequence.context_hash for sequence in chained],
            steps,
            [sequence.prompt_tokens + sequence.output_tokens for sequence in chained],
            size,
            [sequence.block_keys for sequence in chained],
        )
        for sequence, state in zip(chained, states, strict=True):
            sequence.context_hash = state
            sequence.output_tokens += steps
        reasons: list[FinishReason | None] = []
        for sequence in running:
            reason: FinishReason | None = None
            if sequence.spec.ignore_eos:
                if sequence.output_tokens >= sequence.spec.max_output_tokens:
                    reason = FinishReason.LENGTH
            else:
                for _ in ends:
                    _, reason = self._sample(sequence)
            reasons.append(reason)
        # Sequences of one phase (computed tokens modulo the block size) cross block boundaries
        # in the same steps; each bucket keeps batch order, the order complete() caches in.
        buckets: list[list[int]] = [[] for _ in range(size)]
        for position, computed in enumerate(start):
            buckets[computed % size].append(position)
        for index in range(len(ends)):
            for position in buckets[-index % size]:
                self._allocate(running[position], 1)
            if self._caching:
                for position in buckets[-(index + 1) % size]:
                    sequence = running[position]
                    sequence.num_computed_tokens = start[position] + index + 1
                    self._cache_full_blocks(sequence)
        finished: list[FinishedRequest] = []
        last_s = ends[-1]
        for position, sequence in enumerate(running):
            sequence.num_computed_tokens = start[position] + len(ends)
            sequence.last_token_s = last_s
            reason = reasons[position]
            if reason is not None:
                self._running.remove(sequence)
                finished.append(self._finish(sequence, reason, last_s))
        self._next_step_id += len(ends)
        self._steps_total += len(ends)
        return DecodeRun(
            started_s=started_s,
            ends_s=tuple(ends),
            request_ids=tuple(sequence.spec.request_id for sequence in running),
            finished=finished,
        )

    # --- internals -------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self._block_size)

    def _allocatable(self) -> int:
        return self._free_blocks + len(self._evictable)

    def _allocate(self, sequence: _Sequence, blocks: int) -> None:
        """Give `sequence` new private blocks: never-used ones first, then the least recently
        freed cached ones, which leave the cache (the caller checked that they suffice)."""
        if blocks <= 0:
            return
        fresh = min(blocks, self._free_blocks)
        self._free_blocks -= fresh
        for _ in range(blocks - fresh):
            self._evictable.popitem(last=False)
        sequence.private_blocks += blocks

    def _cache_hit(self, sequence: _Sequence) -> list[int]:
        """The keys of the leading blocks of `sequence` the cache holds, leaving at least its
        last token to compute."""
        if not self._caching:
            return []
        hits: list[int] = []
        limit = (sequence.num_tokens - 1) // self._block_size
        for key in sequence.block_keys[:limit]:
            if key not in self._in_use and key not in self._evictable:
                break
            hits.append(key)
        return hits

    def _hold_cached(self, key: int) -> None:
        if key in self._evictable:
            del self._evictable[key]
            self._in_use[key] = 1
        else:
            self._in_use[key] += 1

    def _cache_full_blocks(self, sequence: _Sequence) -> None:
        """Name the blocks that became full and computed: each is shared from now on. A block
        whose content is cached already is merged into that one (its own block is freed)."""
        full = sequence.num_computed_tokens // self._block_size
        for key in sequence.block_keys[len(sequence.shared_keys) : full]:
            sequence.private_blocks -= 1
            if key in self._in_use or key in self._evictable:
                self._hold_cached(key)
                self._free_blocks += 1
            else:
                self._in_use[key] = 1
            sequence.shared_keys.append(key)

    def _release(self, sequence: _Sequence) -> None:
        # Freed last block first, so that a request's tail is evicted before its prefix, which
        # more requests are likely to share (vLLM frees in reverse order for the same reason).
        for key in reversed(sequence.shared_keys):
            holders = self._in_use[key] - 1
            if holders:
                self._in_use[key] = holders
            else:
                del self._in_use[key]
                self._evictable[key] = None
        self._free_blocks += sequence.private_blocks
        sequence.shared_keys = []
        sequence.private_blocks = 0

    def _preempt(self, sequence: _Sequence) -> None:
        self._release(sequence)
        sequence.num_computed_tokens = 0
        sequence.preempted = True
        self._waiting.appendleft(sequence)

    def _draw(self, spec: RequestSpec, state: int, output_tokens: int) -> tuple[int, bool]:
        """The token sampled after a context of hash `state` holding `output_tokens` output
        tokens of `spec`, and whether it is the pseudo-EOS that ends the request."""
        stops = (
            not spec.ignore_eos
            and output_tokens >= spec.min_tokens
            and eos_sampled(state, self._eos_threshold)
        )
        return (EOS_TOKEN_ID if stops else next_token_id(state)), stops

    def _sample(self, sequence: _Sequence) -> tuple[int, FinishReason | None]:
        """The next token of `sequence`, a function of its context, appended to it; and why the
        request ends with it, if it does."""
        spec = sequence.spec
        state = sequence.context_hash
        if spec.ignore_eos:
            # The common case of benchmarks, taken for every token: no EOS draw.
            token_id, stops = next_token_id(state), False
        else:
            token_id, stops = self._draw(spec, state, sequence.output_tokens)
        return token_id, self._append_token(
            sequence, token_id, extend_hash(state, token_id), stops=stops
        )

    def _append_token(
        self, sequence: _Sequence, token_id: int, state: int, *, stops: bool
    ) -> FinishReason | None:
        """Append `token_id` (the EOS when `stops`) to `sequence`, whose context's hash becomes
        `state`; why the request ends with it, if it does."""
        sequence.context_hash = state
        output = sequence.output_tokens + 1
        sequence.output_tokens = output
        if (sequence.prompt_tokens + output) % self._block_size == 0:
            sequence.block_keys.append(state)
        spec = sequence.spec
        if stops:
            # vLLM reports "stop" when EOS is sampled, even on the max_tokens-th token.
            return FinishReason.STOP
        if output >= spec.max_output_tokens:
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
            cached_tokens=sequence.cached_tokens or 0,
            cache_creation_tokens=sequence.cache_creation_tokens,
        )
