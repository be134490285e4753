"""The budget at every instant, from the gateways' side (pure).

Each simulated gateway logs an event whenever what one of its tenants may hold changes: the
larger of the limit it applies and the requests running there (a shrunk limit leaves running
requests to finish, so until they drain the gateway holds more than its limit). Each event is
stamped with the wall clock when the change happened, before the message that tells the control
plane about it is sent, so that, all generators being on one host and one clock, the merged
events are in causal order.

The check: after every instant (all events with one time stamp, e.g. one gateway applying an
update, count as one instant), the sum over gateways and tenants of the held slots is within
the pool's budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

KEPT_VIOLATIONS = 20
"""Violating instants listed in the result (all are counted)."""


class HeldLog:
    """Collects one process's held-slot events: (wall s, cell, held slots)."""

    def __init__(self) -> None:
        self._times: list[FloatArray] = []
        self._cells: list[IntArray] = []
        self._values: list[IntArray] = []

    def record(self, wall_s: float, cells: IntArray, values: IntArray) -> None:
        """Cells (global ids, see cell_id) whose held slots became `values` at `wall_s`."""
        if len(cells) == 0:
            return
        self._times.append(np.full(len(cells), wall_s, dtype=np.float64))
        self._cells.append(np.asarray(cells, dtype=np.int64))
        self._values.append(np.asarray(values, dtype=np.int64))

    def arrays(self) -> tuple[FloatArray, IntArray, IntArray]:
        """Every event so far, in the order recorded."""
        if not self._times:
            return (
                np.zeros(0, dtype=np.float64),
                np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=np.int64),
            )
        return (
            np.concatenate(self._times),
            np.concatenate(self._cells),
            np.concatenate(self._values),
        )


def cell_id(gateway: int, tenant: int, tenants: int) -> int:
    """The global id of (gateway, tenant) when the pool has `tenants` tenants."""
    return gateway * tenants + tenant


@dataclass(frozen=True)
class Violation:
    """An instant where the gateways held more than the budget."""

    wall_s: float
    held_slots: int


@dataclass(frozen=True)
class BudgetCheck:
    """The check's result over a whole run."""

    budget_slots: int
    events: int
    instants: int
    max_held_slots: int
    max_held_at_wall_s: float | None
    violations: int
    """Instants above the budget."""
    first_violations: tuple[Violation, ...] = field(default_factory=tuple)
    """The first KEPT_VIOLATIONS of them."""

    @property
    def ok(self) -> bool:
        return self.violations == 0


def check_budget(
    times: FloatArray, cells: IntArray, values: IntArray, *, budget_slots: int
) -> BudgetCheck:
    """Merge events of any number of processes (in any order) and check the budget after every
    instant. A cell holds 0 before its first event. Events with the same time stamp apply in the
    order given (one process's record order), and only their end state is checked."""
    count = len(times)
    if count == 0:
        return BudgetCheck(budget_slots, 0, 0, 0, None, 0)
    arrival = np.arange(count)
    by_time = np.lexsort((arrival, times))
    t = np.asarray(times, dtype=np.float64)[by_time]
    c = np.asarray(cells, dtype=np.int64)[by_time]
    v = np.asarray(values, dtype=np.int64)[by_time]
    # Each event's change to the total is its value minus the same cell's previous value:
    # group by cell keeping time order (lexsort is stable), take differences within a group.
    by_cell = np.lexsort((np.arange(count), c))
    cells_sorted = c[by_cell]
    values_sorted = v[by_cell]
    previous = np.concatenate(([0], values_sorted[:-1]))
    first_of_cell = np.concatenate(([True], cells_sorted[1:] != cells_sorted[:-1]))
    previous[first_of_cell] = 0
    delta = np.empty(count, dtype=np.int64)
    delta[by_cell] = values_sorted - previous
    total = np.cumsum(delta)
    last_of_instant = np.concatenate((t[1:] != t[:-1], [True]))
    instant_times = t[last_of_instant]
    instant_totals = total[last_of_instant]
    worst = int(np.argmax(instant_totals))
    over = np.flatnonzero(instant_totals > budget_slots)
    return BudgetCheck(
        budget_slots=budget_slots,
        events=count,
        instants=len(instant_times),
        max_held_slots=int(instant_totals[worst]),
        max_held_at_wall_s=float(instant_times[worst]),
        violations=len(over),
        first_violations=tuple(
            Violation(float(instant_times[i]), int(instant_totals[i]))
            for i in over[:KEPT_VIOLATIONS]
        ),
    )
