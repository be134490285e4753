"""The allocation policies' names and settings (controlplane/core/policies.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr

from slotshift.config.base import ConfigModel, PositiveSeconds
from slotshift.config.tls import ClientTlsConfig

PolicyName = Literal["static", "demand", "slo", "agent"]
"""The allocation policies the control plane knows (see controlplane/core/policies.py)."""


class SloPolicyConfig(ConfigModel):
    """How the slo policy trades throughput against latency (controlplane/core/slo_policy.py)."""

    demand_half_life_s: PositiveSeconds = 2.0
    """How fast the policy forgets a tenant's past demand: rising demand counts at once, falling
    demand decays with this half-life, so that a bursty tenant's slots are lent out gradually."""

    hysteresis_slots: Annotated[int, Field(ge=0)] = 1
    """Changes of at most this many slots per tenant are not made (unless a tenant is owed its
    share back): the limits do not flap with noise in the demand."""

    max_borrow_step_slots: Annotated[int, Field(ge=1)] = 24
    """Most a tenant's limit may grow above its nominal share in one decision. Giving back is not
    limited: a tenant below its nominal share gets what it asks for at once."""

    slo_boost: Annotated[float, Field(ge=0)] = 2.0
    """How strongly a tenant whose p99 latency is over its SLO is favoured: its claim is multiplied
    by 1 + slo_boost x (p99 / SLO - 1)."""

    kv_saturation_perc: Annotated[float, Field(gt=0, le=1)] = 0.95
    """KV-cache usage at or above which the engine counts as saturated: more borrowing would only
    add waiting, so borrowers do not grow further (the cost term)."""

    waiting_saturation_percent: Annotated[float, Field(gt=0, le=100)] = 5.0
    """Requests waiting inside the engine, in percent of the pool's budget (at least one), at or
    above which the engine also counts as saturated. A request waits there briefly between its
    arrival and the next step, so a few waiting is normal and not saturation."""

    full_share_hold_percent: Annotated[float, Field(gt=0, le=100)] | None = 75.0
    """While a tenant that is not preemptible asks at least this percent of its nominal share
    (and no more than all of it), no other tenant holds more than its own nominal share (preemptible tenants' work above it is
    paused): a lender using its share gets the engine as fast as the static split gives it, since
    every request more in the batch makes each of its tokens slower. Unset: borrowing goes on
    beside a busy lender, for more throughput and slower tokens."""

    learned_reserves: bool = False
    """Size each tenant's reserve (the part of its nominal share lent only to preemptible
    tenants, controlplane/core/reserves.py) from its own recent bursts instead of from
    `lendable_percent`: the `reserve_percentile` of its peak concurrency (in flight plus queued)
    in the first `reserve_burst_window_s` of each burst, over a history that decays with
    `reserve_history_half_life_s`; at least its floor, at most `reserve_max_percent` of its
    nominal share. Until a tenant's first burst is recorded, its `lendable_percent` reserve
    applies."""

    reserve_percentile: Annotated[float, Field(gt=0, le=100)] = 95.0
    """Learned reserves: the percentile (in percent) of the recorded bursts' peak concurrency
    that the reserve covers; 100 covers the largest burst of the history."""

    reserve_burst_window_s: PositiveSeconds = 1.0
    """Learned reserves: a burst's peak concurrency is taken over this long from its start (the
    tenant's demand rising above `reserve_idle_demand_slots`): the requests that come before any
    lent slot can return."""

    reserve_idle_demand_slots: Annotated[int, Field(ge=0)] = 0
    """Learned reserves: a tenant whose demand (in flight plus queued) is at most this many slots
    is idle; a burst starts when its demand rises above it."""

    reserve_history_half_life_s: PositiveSeconds = 600.0
    """Learned reserves: a recorded burst counts half as much as a new one after this long, so
    that the reserve follows a tenant whose bursts change; bursts older than ten half-lives are
    forgotten. Choose it longer than the time between a tenant's bursts."""

    reserve_max_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    """Learned reserves: the most a learned reserve may be, in percent of the tenant's nominal
    share (never below its floor)."""


class AgentPolicyConfig(ConfigModel):
    """The agent policy: an LLM behind any OpenAI-compatible chat endpoint proposes the limits;
    a rule-based policy decides whenever its answer is late, invalid or failing."""

    url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the OpenAI-compatible API (`/chat/completions` is appended)."""

    model: str = "Qwen/Qwen2.5-3B-Instruct"
    """The model to ask."""

    api_key: SecretStr | None = None
    """Sent as `Authorization: Bearer`; unset sends none."""

    tls: ClientTlsConfig | None = None
    """How the control plane checks an https `url`, with a client certificate if the endpoint
    requires one; unset: the system's roots for https."""

    deadline_ms: Annotated[float, Field(gt=0)] = 500.0
    """Longest the control loop waits for an answer; past it the fallback decides."""

    fallback: Literal["static", "demand", "slo"] = "slo"
    """The rule-based policy that decides when the agent's answer cannot be used."""

    max_tokens: Annotated[int, Field(ge=16)] = 512
    """Most tokens the answer may take."""

    temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    """Sampling temperature; 0 for the most repeatable answers."""
