"""Dividing a fixed whole number of slots among claimants with bounds and targets.

One pure function, after Kubernetes API Priority and Fairness's `computeConcurrencyAllocation`
(conc_alloc.go): every split of slots in slotshift (nominal shares, the demand policy, the split
of a tenant's limit among gateways, the gateways' fallback split) goes through `apportion`.
It lives in the shared package because both the control plane and the gateways need it; it does
no I/O and reads no clock.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from slotshift.config import PoolConfig

Slots = NDArray[np.int64]
"""Whole slots, one per claim."""

Targets = NDArray[np.float64]
"""Claims' targets, one per claim."""


class ApportionError(ValueError):
    """The total cannot be divided within the claims' bounds."""


@dataclass(frozen=True, slots=True)
class Claim:
    """One claimant: it gets at least `lower` and at most `upper` slots, and otherwise a share
    proportional to `target` (a non-negative weight or demand)."""

    lower: int
    upper: int
    target: float


def apportion(total: int, claims: Sequence[Claim]) -> list[int]:
    """Split `total` slots among `claims`; the i-th result belongs to the i-th claim.

    Contract (checked by tests on 10,000 seeded random cases):
    - the results sum to `total` exactly;
    - each result lies in [lower, upper] of its claim;
    - between the bounds, results are proportional to the targets: there is one factor p with
      result_i = clamp(p * target_i, lower_i, upper_i) before rounding to whole slots, and
      rounding moves no result by a whole slot or more;
    - claims with target 0 stay at their lower bound, unless the positive targets cannot absorb
      the total, in which case those go to their upper bound and the rest is spread evenly over
      the zero-target claims;
    - the result depends only on the arguments (ties are broken by position).

    Raises ApportionError when no split can hold the bounds: a bound is negative, lower > upper,
    a target is negative or not finite, or `total` lies outside [sum of lowers, sum of uppers].
    """
    _check(total, claims)
    if not claims:
        return []
    positive = [i for i, c in enumerate(claims) if c.target > 0]
    zero = [i for i, c in enumerate(claims) if c.target <= 0]
    reachable_by_positive = sum(claims[i].upper for i in positive) + sum(
        claims[i].lower for i in zero
    )
    if reachable_by_positive >= total:
        shares = _proportional(total, claims)
    else:
        # The positive targets saturate; the zero-target claims share the rest evenly.
        rest = total - sum(claims[i].upper for i in positive)
        even = [Claim(claims[i].lower, claims[i].upper, 1.0) for i in zero]
        shares = [0.0] * len(claims)
        for i in positive:
            shares[i] = float(claims[i].upper)
        for i, share in zip(zero, _proportional(rest, even), strict=True):
            shares[i] = share
    return _round(total, claims, shares)


def apportion_arrays(total: int, lower: Slots, upper: Slots, target: Targets) -> Slots:
    """`apportion` over claims given as arrays (the i-th claim is Claim(lower[i], upper[i],
    target[i])): the same result, as an int64 array, and the same ApportionError.

    The float arithmetic is `apportion`'s, element for element, and every sum of floats is
    Python's own `sum` over the same values in the same order, so the results are equal exactly
    (tests/unit/slotshift/test_apportion.py checks it on random cases), not just close. A pass
    over 10,000 claims is a few vectorised operations instead of a Python loop.
    """
    lower = np.asarray(lower, dtype=np.int64)
    upper = np.asarray(upper, dtype=np.int64)
    target = np.asarray(target, dtype=np.float64)
    _check_arrays(total, lower, upper, target)
    if lower.size == 0:
        return np.zeros(0, dtype=np.int64)
    positive = target > 0
    zero = ~positive
    positive_uppers = int(upper[positive].sum())
    if positive_uppers + int(lower[zero].sum()) >= total:
        shares = _proportional_arrays(total, lower, upper, target)
    else:
        # The positive targets saturate; the zero-target claims share the rest evenly.
        shares = np.where(positive, upper, 0).astype(np.float64)
        shares[zero] = _proportional_arrays(
            total - positive_uppers, lower[zero], upper[zero], np.ones(int(zero.sum()))
        )
    return _round_arrays(total, lower, upper, shares)


def nominal_shares(pool: PoolConfig) -> dict[str, int]:
    """Each tenant's nominal share of the pool's budget: by weight, within its floor and ceiling.
    A fresh dict each call (callers may change it)."""
    return dict(_NOMINAL_MEMO.shares(pool))


class _NominalMemo:
    """The nominal shares of the last few pool configs, by identity.

    Every decision, reserve check and pause level asks for the nominal shares of a config that
    changes only through the admin API; at 10,000 tenants computing them (or even building a
    key from the tenants) costs tens of milliseconds. A config is immutable, so its shares never
    change; a copy (`model_copy`) is a new object and is computed afresh. Pure, bounded, and
    holding nothing but configs and their shares, so one memo serves the process.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[int, tuple[PoolConfig, dict[str, int]]] = OrderedDict()

    def shares(self, pool: PoolConfig) -> dict[str, int]:
        entry = self._entries.get(id(pool))
        if entry is not None and entry[0] is pool:
            self._entries.move_to_end(id(pool))
            return entry[1]
        claims = [Claim(t.floor_slots, pool.ceiling_of(t), t.weight) for t in pool.tenants]
        shares = dict(
            zip((t.name for t in pool.tenants), apportion(pool.budget_slots, claims), strict=True)
        )
        self._entries[id(pool)] = (pool, shares)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return shares


_NOMINAL_MEMO = _NominalMemo(size=16)


def _check(total: int, claims: Sequence[Claim]) -> None:
    if total < 0:
        raise ApportionError(f"total must not be negative, got {total}")
    for index, claim in enumerate(claims):
        if claim.lower < 0 or claim.upper < claim.lower:
            raise ApportionError(
                f"claim {index}: bounds must satisfy 0 <= lower <= upper, got "
                f"[{claim.lower}, {claim.upper}]"
            )
        if not math.isfinite(claim.target) or claim.target < 0:
            raise ApportionError(
                f"claim {index}: target must be finite and >= 0, got {claim.target}"
            )
    lowers = sum(c.lower for c in claims)
    uppers = sum(c.upper for c in claims)
    if not lowers <= total <= uppers:
        raise ApportionError(
            f"total {total} lies outside [{lowers}, {uppers}], the sums of the lower and upper bounds"
        )


def _check_arrays(total: int, lower: Slots, upper: Slots, target: Targets) -> None:
    """`_check` over arrays: the same error for the same first offending claim."""
    if total < 0:
        raise ApportionError(f"total must not be negative, got {total}")
    bad_bounds = (lower < 0) | (upper < lower)
    bad_target = ~np.isfinite(target) | (target < 0)
    bad = np.flatnonzero(bad_bounds | bad_target)
    if bad.size:
        index = int(bad[0])
        if bad_bounds[index]:
            raise ApportionError(
                f"claim {index}: bounds must satisfy 0 <= lower <= upper, got "
                f"[{int(lower[index])}, {int(upper[index])}]"
            )
        raise ApportionError(
            f"claim {index}: target must be finite and >= 0, got {float(target[index])}"
        )
    lowers = int(lower.sum())
    uppers = int(upper.sum())
    if not lowers <= total <= uppers:
        raise ApportionError(
            f"total {total} lies outside [{lowers}, {uppers}], the sums of the lower and upper bounds"
        )


def _proportional_arrays(total: int, lower: Slots, upper: Slots, target: Targets) -> Targets:
    """`_proportional` over arrays, with the same breakpoints, the same binary search and the
    same sums (Python's `sum` over the values in claim order: numpy's pairwise sum would round
    differently)."""
    low = lower.astype(np.float64)
    high = upper.astype(np.float64)

    def clamped(p: float) -> Targets:
        result: Targets = np.minimum(np.maximum(p * target, low), high)
        return result

    def filled(p: float) -> float:
        return float(sum(clamped(p).tolist()))

    positive = target > 0
    # A tiny target puts its breakpoints at infinity, as Python's division does.
    with np.errstate(over="ignore"):
        scaled_bounds = (lower[positive] / target[positive], upper[positive] / target[positive])
    breakpoints: list[float] = np.unique(np.concatenate(([0.0], *scaled_bounds))).tolist()
    previous = breakpoints[0]
    if filled(previous) >= total:
        return clamped(previous)
    index = bisect.bisect_left(breakpoints, True, lo=1, key=lambda point: filled(point) >= total)
    if index == len(breakpoints):
        return np.where(positive, high, low)
    previous, point = breakpoints[index - 1], breakpoints[index]
    middle = (previous + point) / 2
    scaled = middle * target
    slope = sum(target[(lower < scaled) & (scaled < upper)].tolist())
    p = previous + (total - filled(previous)) / slope if slope > 0 else point
    return clamped(p)


def _round_arrays(total: int, lower: Slots, upper: Slots, shares: Targets) -> Slots:
    """`_round` over arrays: floor, then the remainder by largest fraction (ties by position),
    one slot per claim per round; a surplus taken back from the smallest fractions first."""
    result: Slots = np.minimum(np.maximum(np.floor(shares + 1e-9).astype(np.int64), lower), upper)
    fractions = shares - result
    remainder = total - int(result.sum())
    order = np.lexsort((np.arange(result.size), -fractions))
    while remainder > 0:
        room = order[result[order] < upper[order]]
        if room.size == 0:
            break  # unreachable: the check keeps total within the uppers
        chosen = room[:remainder]
        result[chosen] += 1
        remainder -= int(chosen.size)
    if remainder < 0:
        backwards = order[::-1]
        spare = result[backwards] - lower[backwards]
        before = np.cumsum(spare) - spare
        result[backwards] -= np.clip(-remainder - before, 0, spare)
    return result


def _proportional(total: int, claims: Sequence[Claim]) -> list[float]:
    """Real shares clamp(p * target, lower, upper) summing to total, p found exactly.

    f(p) = sum clamp(p * t_i, l_i, u_i) is continuous, non-decreasing and piecewise linear with
    breakpoints l_i / t_i and u_i / t_i; find the segment holding `total` and solve on it.
    """

    def filled(p: float) -> float:
        return sum(_clamp(p * c.target, c.lower, c.upper) for c in claims)

    breakpoints = sorted(
        {0.0}
        | {c.lower / c.target for c in claims if c.target > 0}
        | {c.upper / c.target for c in claims if c.target > 0}
    )
    previous = breakpoints[0]
    if filled(previous) >= total:
        return [_clamp(previous * c.target, c.lower, c.upper) for c in claims]
    # The first breakpoint where the claims hold the total: f is non-decreasing, so a binary
    # search finds the same one a scan would, in O(n log n) instead of O(n^2).
    index = bisect.bisect_left(breakpoints, True, lo=1, key=lambda point: filled(point) >= total)
    if index == len(breakpoints):
        return [float(c.upper) if c.target > 0 else float(c.lower) for c in claims]
    previous, point = breakpoints[index - 1], breakpoints[index]
    # On (previous, point) the claims strictly between their bounds grow linearly.
    middle = (previous + point) / 2
    slope = sum(c.target for c in claims if c.lower < middle * c.target < c.upper)
    p = previous + (total - filled(previous)) / slope if slope > 0 else point
    return [_clamp(p * c.target, c.lower, c.upper) for c in claims]


def _round(total: int, claims: Sequence[Claim], shares: Sequence[float]) -> list[int]:
    """Whole slots: floor each share, then hand out the remainder by largest fraction."""
    result = [
        min(max(math.floor(s + 1e-9), c.lower), c.upper)
        for s, c in zip(shares, claims, strict=True)
    ]
    fractions = [s - r for s, r in zip(shares, result, strict=True)]
    remainder = total - sum(result)
    order = sorted(range(len(claims)), key=lambda i: (-fractions[i], i))
    while remainder > 0:
        for i in order:
            if remainder == 0:
                break
            if result[i] < claims[i].upper:
                result[i] += 1
                remainder -= 1
    for i in reversed(order):
        if remainder == 0:
            break
        while remainder < 0 and result[i] > claims[i].lower:
            result[i] -= 1
            remainder += 1
    return result


def _clamp(value: float, lower: int, upper: int) -> float:
    return min(max(value, float(lower)), float(upper))
