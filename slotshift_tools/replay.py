"""Recorded traffic as an arrival schedule: a merged request log (slotshift/request_log.py) turned
into each tenant's open-loop sends, the form the bench's open-loop processes take
(slotshift_tools/bench/arrivals.py: send times from the start of the load, and a request shape
each: prompt length and max_tokens), so that the twin can run yesterday's traffic under any
policy and config.

`replay_schedule` is a pure function of the records and its options. What each replayed request
asks for:

- its send time: its recorded arrival at the gateway, from the schedule's origin;
- its prompt length: the recorded prompt tokens (`default_prompt_tokens` where the log has none,
  or the request is left out and counted);
- its output length (sent as max_tokens with ignore_eos, as the bench does, so that the length is
  exact): for a completed request the tokens it got; for one that did not complete (rejected,
  timed out, cancelled, failed upstream), which never showed how long it would have been, the
  max_tokens it asked for, else the tokens it got before it ended, else `default_output_tokens`.

What a replay cannot know, and so does not reproduce:

- **Closed-loop clients.** A client that waits for an answer before it sends again (a chat user,
  a batch worker with a fixed concurrency) sent when the recorded system let it. Its requests are
  replayed open loop at the recorded instants: a faster system would have seen them sooner and
  more of them, a slower one later and fewer, so a replay under a better policy understates that
  client's throughput gain and one under a worse policy overstates its queueing. The log cannot
  tell such a client from an open-loop one; a tenant known to be closed loop is better modelled
  by a scenario's `closed_loop` process with the recorded lengths.
- **Retries.** A rejected request that the client sent again appears twice (or more): the replay
  sends both, though under a policy that admitted the first the second would never have come.
  The session hash groups a client's requests but cannot tell a retry from a new request.
- **Content.** Prompts are not recorded, only their lengths: the replay's prompts are random
  token ids (`ReplayedRequest.shape`), so prefix-cache hits of the recorded traffic (shared
  system prompts, multi-turn sessions) are lost and prefills cost what a cold cache costs.
- **Client cancellations** are replayed as whole requests; `cancel_after_s` says when the client
  went away, for a twin that wants to cancel them at the same age.
- **Outputs that stopped early** (an EOS before max_tokens) are replayed at the length they had,
  which is exact only because ignore_eos makes the replay stop there too.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from slotshift.request_log import Outcome, RequestRecord
from slotshift_tools.bench.arrivals import PROMPT_TOKEN_ID_RANGE, RequestShape, uniform_ids


@dataclass(frozen=True, slots=True)
class ReplayedRequest:
    """One recorded request, as the replay sends it."""

    send_at_s: float
    """Seconds from the schedule's origin to its recorded arrival."""

    prompt_tokens: int
    """Prompt length (>= 1)."""

    output_tokens: int
    """Output length (>= 1): sent as max_tokens with ignore_eos."""

    streamed: bool
    """Whether the client asked for a stream (a request whose body was not read counts as
    streamed, as the bench's requests are)."""

    recorded: Outcome
    """How it ended when recorded."""

    cancel_after_s: float | None = None
    """For a request its client cancelled: how long after arrival the client went away."""

    session: str | None = None
    """The recorded session hash (requests of one session share it)."""

    gateway: str = ""
    """The gateway that recorded it."""

    def shape(self, rng: random.Random) -> RequestShape:
        """The request as the bench's client sends it: `prompt_tokens` random token ids drawn
        from `rng` (the bench's range, clear of special tokens), max_tokens, streamed or not as
        recorded."""
        low, high = PROMPT_TOKEN_ID_RANGE
        return RequestShape(
            uniform_ids(rng, low, high, self.prompt_tokens), self.output_tokens, self.streamed
        )


@dataclass(frozen=True, slots=True)
class TenantSchedule:
    """One tenant's open-loop sends, in order."""

    tenant: str
    requests: tuple[ReplayedRequest, ...]

    @property
    def send_times(self) -> list[float]:
        """The send times, ascending: what `arrival_times` gives for a drawn process."""
        return [request.send_at_s for request in self.requests]


@dataclass(frozen=True, slots=True)
class ReplaySchedule:
    """A recorded log as the tenants' sends."""

    origin_unix_s: float
    """The wall-clock instant send times count from."""

    horizon_s: float
    """Every send is before this (seconds from the origin): the window's end when one was
    given, else just past the last arrival."""

    tenants: dict[str, TenantSchedule]
    """Per tenant, in order of first appearance."""

    left_out: dict[str, int] = field(default_factory=dict)
    """Records not replayed, by why: `invalid` (bodies the gateway refused: never admissible),
    `prompt_tokens_unknown`, `output_tokens_unknown`, `outside_window`, `other_pool`,
    `other_tenant`."""

    @property
    def requests(self) -> int:
        """Requests replayed, all tenants together."""
        return sum(len(t.requests) for t in self.tenants.values())


def replay_schedule(
    records: Iterable[RequestRecord],
    *,
    pool: str | None = None,
    tenants: Collection[str] | None = None,
    start_unix_s: float | None = None,
    end_unix_s: float | None = None,
    default_prompt_tokens: int | None = None,
    default_output_tokens: int | None = None,
) -> ReplaySchedule:
    """The per-tenant open-loop schedule of `records` (in arrival order, as `merge_logs` gives
    them; ValueError otherwise) that arrived in [start_unix_s, end_unix_s) (either bound may be
    left open), of `pool` and of `tenants` when given. Send times count from start_unix_s, else
    from the first replayed arrival. The lengths: see the module docstring; a record whose
    length is unknown and has no default is left out and counted in `left_out`. ValueError too
    for a default below 1 or a window that ends before it starts."""
    for name, default in (
        ("default_prompt_tokens", default_prompt_tokens),
        ("default_output_tokens", default_output_tokens),
    ):
        if default is not None and default < 1:
            raise ValueError(f"{name} must be >= 1, not {default}")
    if start_unix_s is not None and end_unix_s is not None and end_unix_s < start_unix_s:
        raise ValueError(f"the window ends ({end_unix_s}) before it starts ({start_unix_s})")
    wanted = None if tenants is None else frozenset(tenants)
    left_out: dict[str, int] = {}
    kept: list[tuple[RequestRecord, int, int]] = []
    previous = float("-inf")
    for record in records:
        if record.arrival_unix_s < previous:
            raise ValueError(
                f"records out of arrival order ({record.arrival_unix_s} after {previous}):"
                " merge the logs first (slotshift.request_log.merge_logs)"
            )
        previous = record.arrival_unix_s
        why = _excluded(record, pool, wanted, start_unix_s, end_unix_s)
        if why is None:
            prompt = record.prompt_tokens if record.prompt_tokens else default_prompt_tokens
            output = _output_length(record, default_output_tokens)
            if prompt is None:
                why = "prompt_tokens_unknown"
            elif output is None:
                why = "output_tokens_unknown"
            else:
                kept.append((record, prompt, output))
                continue
        left_out[why] = left_out.get(why, 0) + 1
    if start_unix_s is not None:
        origin = start_unix_s
    else:
        origin = kept[0][0].arrival_unix_s if kept else 0.0
    by_tenant: dict[str, list[ReplayedRequest]] = {}
    for record, prompt, output in kept:
        by_tenant.setdefault(record.tenant, []).append(
            ReplayedRequest(
                send_at_s=record.arrival_unix_s - origin,
                prompt_tokens=prompt,
                output_tokens=output,
                streamed=record.streamed is not False,
                recorded=record.outcome,
                cancel_after_s=record.e2e_ms / 1000.0
                if record.outcome is Outcome.CANCELLED
                else None,
                session=record.session,
                gateway=record.gateway,
            )
        )
    if end_unix_s is not None:
        horizon = end_unix_s - origin
    else:
        last = max((r.arrival_unix_s for r, _, _ in kept), default=origin)
        # Just past the last send, as a drawn schedule's sends are all before its horizon.
        horizon = (last - origin) + 1e-6
    return ReplaySchedule(
        origin_unix_s=origin,
        horizon_s=horizon,
        tenants={name: TenantSchedule(name, tuple(sent)) for name, sent in by_tenant.items()},
        left_out=left_out,
    )


def _excluded(
    record: RequestRecord,
    pool: str | None,
    tenants: frozenset[str] | None,
    start_unix_s: float | None,
    end_unix_s: float | None,
) -> str | None:
    """Why `record` is not replayed, before its lengths are looked at; None: it may be."""
    if record.outcome is Outcome.INVALID:
        return "invalid"
    if pool is not None and record.pool != pool:
        return "other_pool"
    if tenants is not None and record.tenant not in tenants:
        return "other_tenant"
    if (start_unix_s is not None and record.arrival_unix_s < start_unix_s) or (
        end_unix_s is not None and record.arrival_unix_s >= end_unix_s
    ):
        return "outside_window"
    return None


def _output_length(record: RequestRecord, default: int | None) -> int | None:
    """The output length a replay asks for (see the module docstring); at least 1."""
    if record.outcome is Outcome.COMPLETED:
        candidates = (record.output_tokens, record.max_tokens, default)
    else:
        candidates = (record.max_tokens, record.output_tokens, default)
    for candidate in candidates:
        if candidate is not None:
            return max(1, candidate)
    return None
