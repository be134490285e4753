"""What one gateway's next allocation update carries, and whether it may wait.

The control plane pushes each gateway only what changed since the last update on its stream
(go-control-plane's incremental xDS): the first update of a stream is whole, the others name the
tenants whose target, limit or pause level moved. An update goes out at once when somebody waits
for it: it carries a reclaim (a pause level changes), a decision (some tenant's pool-wide limit
moved: a shrink gives its slots to someone else, and the decision counts as taken only once
every gateway it changed has acknowledged it), a grant to a lender with requests queued at that
gateway, or any shrink while some lender waits for slots the grants could not give it yet (the
slots it waits for are freed by the gateways' acknowledgements) or while the gateways may hold
more than the budget together (a late gateway's fallback split). Anything else (headroom moving
between gateways, a borrower's part following its queues) may wait for the gateway's next push
slot, so that demand moving between gateways costs at most one update per gateway per
`push_min_interval_ms`.

Pure: arrays in, a new value out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controlplane.core.allocation import CellLimits


@dataclass(frozen=True, slots=True, eq=False)
class GatewayRow:
    """One gateway's limits for every tenant, as pushed or to push."""

    tenants: tuple[str, ...]
    targets: NDArray[np.int64]
    limits: NDArray[np.int64]
    pauses: NDArray[np.int64]
    pool_limits: NDArray[np.int64]
    """Each tenant's pool-wide limit in the allocation the row belongs to."""

    @classmethod
    def of(cls, cells: CellLimits, row: int) -> GatewayRow:
        """Row `row` of `cells` (views: the cells' arrays are read-only)."""
        return cls(
            cells.tenants,
            cells.targets[row],
            cells.limits[row],
            cells.pauses[row],
            cells.pool_limits,
        )


@dataclass(frozen=True, slots=True, eq=False)
class Waiting:
    """Who waits for slots, as the pool knows it now (in the row's columns)."""

    queued: NDArray[np.int64]
    """Requests of each tenant queued at this gateway, as it last said."""
    lending: NDArray[np.bool_]
    """Whether each tenant holds at most its nominal share pool-wide (a lender, or at share)."""
    lender_short: bool
    """Whether some lender has requests queued at a gateway whose grant is below its target
    there: it waits for slots other gateways still hold."""
    over_budget: bool = False
    """Whether the gateways may hold more than the budget together (a gateway that connected
    late ran on its fallback split while another was granted its part): every shrink counts."""


@dataclass(frozen=True, slots=True, eq=False)
class Push:
    """The next update for one gateway."""

    columns: NDArray[np.intp] | None
    """The tenants (columns of the row) it names; None: every tenant, a whole update."""
    urgent: bool
    """Whether it goes out at once rather than at the gateway's next push slot."""


def next_push(pushed: GatewayRow | None, row: GatewayRow, waiting: Waiting | None) -> Push:
    """What to send a gateway that last got `pushed` (None: nothing yet on this stream) so that
    it enforces `row`, given who waits for slots (None: unknown, every change counts as waited
    for).

    Contract (tests/unit/controlplane/test_push.py):
    - nothing pushed yet, or other tenants than last time: a whole update, urgent;
    - otherwise exactly the tenants whose target, limit or pause differ (possibly none);
    - urgent exactly when, among them, some pause level or pool-wide limit differs, or some
      limit falls while `waiting.lender_short` or `waiting.over_budget`, or some limit rises
      for a lending tenant with requests queued at the gateway; with `waiting` None, when some
      limit or pause level differs.
    """
    if pushed is None or pushed.tenants != row.tenants:
        return Push(columns=None, urgent=True)
    moved = (
        (pushed.targets != row.targets)
        | (pushed.limits != row.limits)
        | (pushed.pauses != row.pauses)
    )
    columns = np.flatnonzero(moved)
    if columns.size == 0:
        return Push(columns=columns, urgent=False)
    before, after = pushed.limits[columns], row.limits[columns]
    repaused = bool((row.pauses[columns] != pushed.pauses[columns]).any())
    fell = after < before
    raised = after > before
    if waiting is None:
        return Push(columns=columns, urgent=repaused or bool((fell | raised).any()))
    decided = row.pool_limits[columns] != pushed.pool_limits[columns]
    granted = raised & waiting.lending[columns] & (waiting.queued[columns] > 0)
    urgent = (
        repaused
        or bool(decided.any())
        or ((waiting.lender_short or waiting.over_budget) and bool(fell.any()))
        or bool(granted.any())
    )
    return Push(columns=columns, urgent=urgent)


class PushSlots:
    """One gateway stream's push slots: when an update that may wait may go out next.

    Every update, urgent or not, takes the next slot of a ledger that advances by `interval_s`
    a send (a token bucket that urgent updates may overdraw: they go at once). An update that
    may wait goes at the ledger's slot, but never later than `most_ahead` intervals after the
    last send, so that a burst of urgent updates does not hold the next change for long; the
    ledger keeps the debt beyond that, and the held updates after it pay it back (each goes at
    most `most_ahead` intervals after the one before). So while urgent updates alone come at
    most once every `most_ahead` intervals, a gateway gets at most one update per interval
    over time, plus one."""

    __slots__ = ("_interval_s", "_ledger_s", "_most_ahead_s", "free_at_s")

    def __init__(self, interval_s: float, *, most_ahead: int = 2) -> None:
        self._interval_s = interval_s
        self._most_ahead_s = most_ahead * interval_s
        self._ledger_s = -float("inf")
        self.free_at_s = -float("inf")
        """When an update that may wait may go out (clock seconds)."""

    def took(self, now_s: float) -> None:
        """An update went out at `now_s`."""
        self._ledger_s = max(self._ledger_s, now_s) + self._interval_s
        self.free_at_s = min(self._ledger_s, now_s + self._most_ahead_s)
