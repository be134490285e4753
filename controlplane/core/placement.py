"""Placement: every gateway's limits for every tenant, as whole arrays.

The pool's cells are one (gateway, tenant) pair each, held as int64 arrays of shape
(gateways, tenants): gateways in sorted id order, tenants in the pool's order. One pass over
them is a handful of vectorised operations, so a pool of 1,000 tenants on 100 gateways (100,000
cells) is placed in about a millisecond, where the per-cell Python of `gateway_split.py`,
`grants.py` and `preemption.py` took over a second. Those modules stay as the reference: each
function here returns exactly what its counterpart returns for the same inputs
(tests/unit/controlplane/test_placement.py checks it on random pools), with cells visited in
the same order (gateway, then tenant).

Pure: no I/O, no clock; arrays in, new arrays out (the inputs are never written).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Counts = NDArray[np.int64]
"""Whole slots or requests: shape (tenants,) or (gateways, tenants)."""

_ROUNDING_SLACK = 1e-9
"""As slotshift/apportion.py: a share a hair under a whole number counts as that number."""


def largest_remainder(total: int, weights: Counts) -> Counts:
    """Split `total` over the cells in proportion to their `weights`, each at most its weight.

    The special case of `slotshift.apportion.apportion(total, [Claim(0, w, w), ...])` (and of
    claims `Claim(0, cap, w)` whose cap no proportional share reaches) that every split of
    placement is: shares `total * w / sum(w)` floored, the remainder handed out one slot at a
    time by largest fraction, ties to the earlier cell. Requires 0 <= total <= sum(weights) and
    weights >= 0; `weights` is flat.
    """
    flat = np.asarray(weights, dtype=np.int64)
    result = np.zeros(flat.shape, dtype=np.int64)
    whole = int(flat.sum())
    if total <= 0 or whole <= 0:
        return result
    if total >= whole:
        return flat.copy()
    shares = (total / whole) * flat.astype(np.float64)
    result = np.minimum(np.floor(shares + _ROUNDING_SLACK).astype(np.int64), flat)
    return _hand_out(total, result, shares, flat)


def _hand_out(total: int, result: Counts, shares: NDArray[np.float64], upper: Counts) -> Counts:
    """apportion's rounding: the slots still missing go to the largest fractions first (ties by
    position), one each per round, never above `upper`."""
    remainder = total - int(result.sum())
    if remainder <= 0:
        return result
    fractions = shares - result
    order = np.lexsort((np.arange(result.size), -fractions))
    while remainder > 0:
        room = order[result[order] < upper[order]]
        chosen = room[:remainder]
        result[chosen] += 1
        remainder -= chosen.size
    return result


def split_targets(limits: Counts, demand: Counts) -> Counts:
    """Each gateway's part of each tenant's limit (`gateway_split.split_among_gateways`).

    limits: (tenants,); demand: (gateways, tenants), in flight plus queued at each gateway.
    A tenant whose limit covers its demand gives each gateway its demand and an even part of the
    rest (the first gateways one more while it does not divide evenly); one whose demand exceeds
    its limit is split in proportion to the demand at each gateway. Every column sums to its
    limit; no gateways: an empty (0, tenants) array.
    """
    gateways, tenants = demand.shape
    targets = np.zeros((gateways, tenants), dtype=np.int64)
    if gateways == 0:
        return targets
    wanted = demand.sum(axis=0)
    headroom = limits - wanted
    covered = headroom >= 0
    if covered.all():
        # Every demand covered (a re-grant's lenders, mostly): no column to pick out.
        return _demand_and_even(headroom, demand)
    if covered.any():
        targets[:, covered] = _demand_and_even(headroom[covered], demand[:, covered])
    over = np.flatnonzero(~covered)
    targets[:, over] = _demand_split(limits[over], demand[:, over])
    return targets


def _demand_and_even(spare: Counts, demand: Counts) -> Counts:
    """Per column, the demand at each gateway and an even part of `spare` (the first gateways
    one more while it does not divide evenly)."""
    gateways = demand.shape[0]
    extra = np.arange(gateways)[:, np.newaxis] < (spare % gateways)[np.newaxis, :]
    parts: Counts = demand + (spare // gateways)[np.newaxis, :] + extra
    return parts


def _demand_split(limits: Counts, demand: Counts) -> Counts:
    """Per column, apportion(limit, [Claim(0, limit, d) ...]) for a demand above the limit:
    proportional to demand (no share reaches the limit before rounding), remainders by largest
    fraction, ties to the earlier gateway. All columns at once: one stable sort per call."""
    shares = (limits / demand.sum(axis=0))[np.newaxis, :] * demand.astype(np.float64)
    cap = np.where(demand > 0, limits[np.newaxis, :], 0).astype(np.int64)
    result: Counts = np.minimum(np.floor(shares + _ROUNDING_SLACK).astype(np.int64), cap)
    remainder = limits - result.sum(axis=0)
    if not (remainder > 0).any():
        return result
    room = result < cap
    # Cells without room sort last; among the rest the largest fraction first, ties by gateway.
    key = np.where(room, -(shares - result), np.inf)
    order = np.argsort(key, axis=0, kind="stable")
    rank = np.empty_like(order)
    rank[order, np.arange(order.shape[1])[np.newaxis, :]] = np.arange(order.shape[0])[:, np.newaxis]
    # One round reaches every column whose remainder fits its cells with room (all but
    # pathological float cases); those left take apportion's further rounds one column at a time.
    result += (room & (rank < remainder[np.newaxis, :])).astype(np.int64)
    for tenant in np.flatnonzero(remainder > room.sum(axis=0)):
        column = result[:, tenant]
        result[:, tenant] = _hand_out(
            int(limits[tenant]), column, shares[:, tenant], cap[:, tenant]
        )
    return result


def idle_beside(targets: Counts, demand: Counts, *, waiting_only: bool) -> NDArray[np.bool_]:
    """Per column (`gateway_split.idle_beside`): some gateway leaves part of the tenant's limit
    unused while another has used its own up (demand at or above its part) or, with
    `waiting_only`, has a request waiting (demand above its part)."""
    if targets.size == 0:
        return np.zeros(targets.shape[1], dtype=bool)
    used = np.greater(demand, targets) if waiting_only else np.greater_equal(demand, targets)
    idle: NDArray[np.bool_] = np.asarray(used.any(axis=0) & (targets > demand).any(axis=0))
    return idle


def resplit(limits: Counts, demand: Counts, targets: Counts, columns: NDArray[np.bool_]) -> Counts:
    """`targets` with the tenants of `columns` split anew (`split_targets`), the others as
    they are."""
    result = np.array(targets, dtype=np.int64)
    if columns.any():
        result[:, columns] = split_targets(limits[columns], demand[:, columns])
    return result


def rebalance(demand: Counts, targets: Counts, columns: NDArray[np.bool_]) -> Counts:
    """`targets` with the parts of the tenants of `columns` moved to where their requests wait,
    by the fewest moves (`gateway_split.rebalance`, same contract); the others as they are.

    Per column, while a request waits at one gateway (demand above its part) and part of the
    limit idles at another (part above demand), a slot moves from the gateway that idles most to
    the one that waits most, ties to the earlier gateway. The gateways that give never wait and
    those that take never idle, so the moves are two water-fills over the column, done for every
    column at once.
    """
    result = np.array(targets, dtype=np.int64)
    chosen = np.flatnonzero(columns)
    if chosen.size == 0 or result.shape[0] == 0:
        return result
    parts = result[:, chosen]
    short = demand[:, chosen] - parts
    waiting = np.maximum(short, 0)
    idle = np.maximum(-short, 0)
    moves = np.minimum(waiting.sum(axis=0), idle.sum(axis=0))
    result[:, chosen] = parts + _take_from_top(waiting, moves) - _take_from_top(idle, moves)
    return result


def _take_from_top(values: Counts, count: Counts) -> Counts:
    """How much to take from each cell (values >= 0) so that `count[c]` units leave column c one
    at a time, each from the cell with the largest value (ties to the earlier row), none below
    0; `count` is at most the column's sum. A water-fill: every cell above a level is cut to it,
    and what is left comes one each from the earliest cells at the level."""
    low = np.zeros(values.shape[1], dtype=np.int64)
    high = values.max(axis=0)
    # The least level with at most `count` above it.
    while (low < high).any():
        middle = (low + high) // 2
        fits = (values - middle).clip(min=0).sum(axis=0) <= count
        high = np.where(fits, middle, high)
        low = np.where(fits, low, middle + 1)
    kept = np.minimum(values, high)
    taken: Counts = values - kept
    left = count - taken.sum(axis=0)
    at_level = (kept == high) & (high > 0)
    taken += at_level & (np.cumsum(at_level, axis=0) <= left)
    return taken


def grant(budget: int, targets: Counts, granted: Counts, bounds: Counts) -> Counts:
    """What every cell may admit now (`grants.compute_grants`, same contract).

    Each grant lies in [0, target]; a cell above its target is cut to it at once; a raise costs
    nothing up to what the cell may hold already (its bound) and beyond that comes only out of
    the budget the bounds leave, shared in proportion to the cells' deficits; when the bounds
    leave room for every target, every grant is its target.
    """
    held = np.maximum(bounds, granted)
    grants = np.maximum(np.minimum(targets, granted), np.minimum(targets, held))
    headroom = budget - int(held.sum())
    deficits = (targets - grants).ravel()
    if headroom <= 0 or not (deficits > 0).any():
        return grants
    wanting = np.flatnonzero(deficits > 0)
    extra = largest_remainder(min(headroom, int(deficits[wanting].sum())), deficits[wanting])
    flat = grants.ravel().copy()
    flat[wanting] += extra
    return flat.reshape(grants.shape)


@dataclass(frozen=True, slots=True)
class PauseTerms:
    """The pool-wide facts about the preemptible tenants, as arrays over the pool's tenants."""

    preemptible: NDArray[np.bool_]
    nominal: Counts
    """Each tenant's own share: work up to it is never paused."""
    limits: Counts
    """Its pool-wide limit under the decision in force."""
    queued: Counts
    """Its requests waiting at the gateways, pool-wide."""


def pause_levels(terms: PauseTerms, in_flight: Counts, grants: Counts) -> Counts:
    """How far each preemptible tenant's running work must shrink at each gateway
    (`preemption.pause_levels`, same contract): the most of its requests that may keep running
    there, or -1 where nothing is paused.

    A tenant has its work above max(limit, nominal share) paused, pool-wide, or what its gateways
    hold above their grants if that is less, spread over those gateways by what each holds above
    its grant; only while another tenant has demand (runs or waits).
    """
    levels = np.full(in_flight.shape, -1, dtype=np.int64)
    wants_room = (terms.queued > 0) | (in_flight.sum(axis=0) > 0)
    wanting = int(wants_room.sum())
    for tenant in np.flatnonzero(terms.preemptible):
        if wanting - int(wants_room[tenant]) <= 0:
            continue
        running = in_flight[:, tenant]
        over = np.maximum(running - grants[:, tenant], 0)
        if not over.any():
            continue
        above_share = int(running.sum()) - max(
            int(terms.limits[tenant]), int(terms.nominal[tenant])
        )
        count = min(int(over.sum()), above_share)
        if count <= 0:
            continue
        cells = np.flatnonzero(over > 0)
        paused = largest_remainder(count, over[cells])
        hit = paused > 0
        levels[cells[hit], tenant] = running[cells[hit]] - paused[hit]
    return levels
