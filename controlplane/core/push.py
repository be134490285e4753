"""What one gateway's next allocation update carries, and whether it may wait.

The control plane pushes each gateway only what changed since the last update on its stream
(go-control-plane's incremental xDS): the first update of a stream is whole, the others name the
tenants whose target, limit or pause level moved. An update that takes slots away (a lower limit,
a new or changed pause level) or raises the limit of a tenant with requests queued at that
gateway is urgent: a lender is waiting for it. Anything else (an idle tenant's headroom moving
between gateways) may wait for the gateway's next push slot, so that demand moving between
gateways costs at most one update per gateway per `push_min_interval_ms`.

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

    @classmethod
    def of(cls, cells: CellLimits, row: int) -> GatewayRow:
        """Row `row` of `cells` (views: the cells' arrays are read-only)."""
        return cls(cells.tenants, cells.targets[row], cells.limits[row], cells.pauses[row])


@dataclass(frozen=True, slots=True, eq=False)
class Push:
    """The next update for one gateway."""

    columns: NDArray[np.intp] | None
    """The tenants (columns of the row) it names; None: every tenant, a whole update."""
    urgent: bool
    """Whether it goes out at once rather than at the gateway's next push slot."""


def next_push(pushed: GatewayRow | None, row: GatewayRow, queued: NDArray[np.int64] | None) -> Push:
    """What to send a gateway that last got `pushed` (None: nothing yet on this stream) so that
    it enforces `row`, given what it has `queued` per tenant (None: unknown, counted as queued).

    Contract (tests/unit/controlplane/test_push.py):
    - nothing pushed yet, or other tenants than last time: a whole update, urgent;
    - otherwise exactly the tenants whose target, limit or pause differ (possibly none);
    - urgent exactly when some limit falls, some pause level differs, or some limit rises for a
      tenant with requests queued at the gateway.
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
    raised = row.limits[columns] > pushed.limits[columns]
    waiting = np.ones(columns.size, dtype=bool) if queued is None else queued[columns] > 0
    urgent = bool(
        (row.limits[columns] < pushed.limits[columns]).any()
        | (row.pauses[columns] != pushed.pauses[columns]).any()
        | (raised & waiting).any()
    )
    return Push(columns=columns, urgent=urgent)
