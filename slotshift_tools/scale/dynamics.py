"""The demand simulated gateways see, and how their requests follow it (pure, numpy, seeded).

Two levels:
- a pool-wide level per tenant (DemandTimeline), in slots: its nominal share times a fixed
  multiplier drawn once per tenant (so that some tenants want more than their share and others
  less, and the policy has slots to lend), moved by the dynamics. It is a function of the seed
  and the step index alone, so that every generator process computes the same one;
- per gateway (GatewayCells), for each tenant, the requests it has there (`wanted`: running plus
  waiting), drawn from a Poisson law around the level's share of that gateway (level / G), and
  redrawn as the dynamics say.

Requests: a closed loop. Each running request ends with the rate 1 / mean_service_s (so requests
drain at their own pace after a shrink: a lower limit never ends a running request); a request
that ends is replaced while `wanted` says so; new ones are admitted up to the applied limit; the
rest wait, at most `max_queued` of them (clients beyond that give up). So in flight stays within
the pushed limit except while it drains after a shrink, and a few wait.

Dynamics:
- steady: the levels never move and each gateway draws its requests once;
- fluctuating: each tenant's level follows a mean-reverting log-normal walk, and each cell is
  redrawn on average every cell_change_s;
- bursty: each tenant is idle (idle_factor of its level) and bursts (burst_factor) now and then,
  every burst_every_s on average, for burst_s; a cell is redrawn when its tenant's state flips,
  and otherwise as under fluctuating.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

Dynamics = Literal["steady", "fluctuating", "bursty"]
DYNAMICS: tuple[str, ...] = get_args(Dynamics)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_TIMELINE_STREAM = 1 << 20
"""The timeline's RNG stream, apart from every gateway's (those are numbered from 0)."""


@dataclass(frozen=True)
class DemandSettings:
    """The demand model's constants (units in the names)."""

    mean_service_s: float = 2.0
    """Mean time a request runs (exponential): a short chat completion."""
    max_queued: int = 8
    """Most requests of one tenant waiting at one gateway: "a few queued"."""
    multiplier_low: float = 0.2
    multiplier_high: float = 1.8
    """Each tenant's level is its nominal share times a multiplier drawn uniformly in
    [low, high] (mean 1: the pool is about fully asked for)."""
    fluctuation_sigma: float = 0.5
    """Standard deviation of the log level under fluctuating demand."""
    fluctuation_tau_s: float = 10.0
    """How fast a fluctuating level forgets where it was (its correlation time)."""
    cell_change_s: float = 2.0
    """Mean time between two redraws of a cell's requests (fluctuating, bursty)."""
    burst_every_s: float = 30.0
    burst_s: float = 5.0
    burst_factor: float = 3.0
    idle_factor: float = 0.5


class DemandTimeline:
    """The pool-wide demand level of every tenant, step by step.

    Step k covers [k * step_s, (k + 1) * step_s) from the run's origin. `advance_to(k)` moves
    the walk forward one step at a time, so that two timelines with the same arguments agree at
    every step whatever steps each was asked for.
    """

    def __init__(
        self,
        nominal: Sequence[int],
        dynamics: Dynamics,
        *,
        step_s: float,
        seed: int,
        settings: DemandSettings,
    ) -> None:
        if dynamics not in DYNAMICS:
            raise ValueError(f"unknown dynamics {dynamics!r} (known: {', '.join(DYNAMICS)})")
        if step_s <= 0:
            raise ValueError("step_s must be positive")
        self._rng = np.random.default_rng([seed, _TIMELINE_STREAM])
        self._dynamics = dynamics
        self._settings = settings
        self._step_s = step_s
        count = len(nominal)
        self._base: FloatArray = np.asarray(nominal, dtype=np.float64) * self._rng.uniform(
            settings.multiplier_low, settings.multiplier_high, count
        )
        self._log_level: FloatArray = np.zeros(count)
        self._burst_left: IntArray = np.zeros(count, dtype=np.int64)
        self.step = 0
        """The step the levels are at."""
        self.levels: FloatArray = self._levels()
        """Each tenant's pool-wide demand level now, in slots."""

    @property
    def bursting(self) -> BoolArray:
        """Which tenants burst now (all False unless bursty)."""
        return self._burst_left > 0

    def advance_to(self, step: int) -> None:
        """Move to `step`; a step already passed leaves the levels as they are."""
        while self.step < step:
            self._advance()
            self.step += 1
        self.levels = self._levels()

    def _advance(self) -> None:
        settings = self._settings
        count = len(self._base)
        if self._dynamics == "fluctuating":
            rho = math.exp(-self._step_s / settings.fluctuation_tau_s)
            noise = self._rng.standard_normal(count)
            self._log_level = (
                rho * self._log_level
                + settings.fluctuation_sigma * math.sqrt(1.0 - rho * rho) * noise
            )
        elif self._dynamics == "bursty":
            self._burst_left = np.maximum(self._burst_left - 1, 0)
            start = self._rng.random(count) < self._step_s / settings.burst_every_s
            steps = max(1, round(settings.burst_s / self._step_s))
            self._burst_left = np.where(
                (self._burst_left == 0) & start, steps, self._burst_left
            ).astype(np.int64)

    def _levels(self) -> FloatArray:
        settings = self._settings
        if self._dynamics == "fluctuating":
            # exp(x - sigma^2 / 2) has mean 1: the walk moves the level, not its average.
            sigma = settings.fluctuation_sigma
            return self._base * np.exp(self._log_level - sigma * sigma / 2.0)
        if self._dynamics == "bursty":
            factor = np.where(self.bursting, settings.burst_factor, settings.idle_factor)
            return self._base * factor
        return self._base.copy()


class GatewayCells:
    """One simulated gateway's tenants: applied limit, requests running, requests wanted.

    Arrays are indexed by tenant, in the pool's order. Counters (admitted, completed) count
    since the gateway started, as a real gateway's do.
    """

    def __init__(self, limits: Sequence[int], *, max_queued: int) -> None:
        count = len(limits)
        self.limit: IntArray = np.asarray(limits, dtype=np.int64).copy()
        self.in_flight: IntArray = np.zeros(count, dtype=np.int64)
        self.wanted: IntArray = np.zeros(count, dtype=np.int64)
        self.admitted_total: IntArray = np.zeros(count, dtype=np.int64)
        self.completed_total: IntArray = np.zeros(count, dtype=np.int64)
        self._max_queued = max_queued
        self._seen_bursting: BoolArray = np.zeros(count, dtype=np.bool_)
        self._drawn = False

    @property
    def queued(self) -> IntArray:
        """Requests waiting: wanted and not running, at most max_queued a tenant."""
        queued: IntArray = np.clip(self.wanted - self.in_flight, 0, self._max_queued)
        return queued

    def held(self) -> IntArray:
        """What each tenant may be holding here now: the larger of its limit and what runs (a
        shrunk limit leaves the running requests to finish)."""
        return np.maximum(self.limit, self.in_flight)

    def redraw(
        self,
        share: FloatArray,
        *,
        bursting: BoolArray,
        dynamics: Dynamics,
        dt_s: float,
        settings: DemandSettings,
        rng: np.random.Generator,
    ) -> None:
        """Draw the requests wanted anew where the dynamics say; `share` is each tenant's level
        divided among the gateways."""
        if not self._drawn:
            mask = np.ones(len(share), dtype=np.bool_)
            self._drawn = True
        elif dynamics == "steady":
            return
        else:
            probability = 1.0 - math.exp(-dt_s / settings.cell_change_s)
            mask = rng.random(len(share)) < probability
            if dynamics == "bursty":
                mask |= bursting != self._seen_bursting
        self._seen_bursting = bursting.copy()
        if mask.any():
            self.wanted[mask] = rng.poisson(share[mask])

    def serve(self, dt_s: float, *, mean_service_s: float, rng: np.random.Generator) -> None:
        """`dt_s` of running: requests end at their own pace, then the loop admits more."""
        probability = 1.0 - math.exp(-dt_s / mean_service_s)
        ended = rng.binomial(self.in_flight, probability).astype(np.int64)
        self.in_flight -= ended
        self.completed_total += ended
        self.admit()

    def admit(self) -> None:
        """Admit waiting requests up to the limit (never above it)."""
        room = np.clip(np.minimum(self.limit, self.wanted) - self.in_flight, 0, None)
        self.in_flight += room
        self.admitted_total += room

    def apply_limits(self, limits: IntArray) -> None:
        """Enforce new limits: nothing running ends (a shrink only stops admissions); call
        admit() afterwards to let waiting requests into a raised limit."""
        self.limit = np.asarray(limits, dtype=np.int64).copy()
