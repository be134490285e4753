"""The decision log: what each decision saw, chose and why, for GetDecisions and traces.

A decision at a pool of 10,000 tenants sees 10,000 loads and sets 10,000 limits, and most of
them are what the previous decision saw and set. So the log keeps, for each decision, only the
tenants whose figures changed since the one before (and the limits that changed), and rebuilds
whole records from those when asked: its memory is in proportion to what changed, and
`newest(..., changes_only=True)` answers in that size too.

Each entry can also go to a sink (`on_logged`: the state store's writer, controlplane/
state_keeper.py), as stored, with every `keyframe_every`-th entry (and the first) whole: a
reader of the store rebuilds whole records from the key frame before them (`rebuild`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from controlplane.core.snapshot import TelemetryView, TenantLoad


class DecisionOutcome(enum.Enum):
    PUBLISHED = "published"
    """The limits changed and a new allocation version was published."""
    HELD = "held"
    """The policy kept the limits as they were."""
    REJECTED = "rejected"
    """The policy failed or its answer was invalid; the last good allocation stays."""


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision, as GetDecisions returns it."""

    id: int
    pool: str
    decided_at_wall_s: float
    policy: str
    trigger: str
    """Why it ran when it did: "period", or the fast path's reason."""
    outcome: DecisionOutcome
    reason: str
    version: int
    """The allocation version in force after the decision."""
    budget_slots: int
    inputs: Mapping[str, TenantLoad]
    """What the decision saw of each tenant (in a record read with changes_only: of each tenant
    whose figures changed since the decision before)."""
    telemetry: TelemetryView | None
    outputs: Mapping[str, int]
    """The tenant limits in force after the decision (with changes_only: those that changed)."""
    duration_ms: float
    fallback: str | None = None
    """Why the policy fell back from its primary source (the agent's answer), if it did."""


AGE_TOLERANCE_S = 1.0
"""Two loads whose demand ages differ by at most this much count as the same (the age moves a
little with every report; a gateway gone quiet moves it by more)."""


def same_figures(a: TenantLoad, b: TenantLoad) -> bool:
    """Whether two loads of a tenant say the same, their demand ages within AGE_TOLERANCE_S: a
    whole record shows a tenant whose figures did not change with the load (and age) of the
    decision that last stored it."""
    if (a.demand_age_s is None) != (b.demand_age_s is None):
        return False
    if (
        a.demand_age_s is not None
        and b.demand_age_s is not None
        and abs(a.demand_age_s - b.demand_age_s) > AGE_TOLERANCE_S
    ):
        return False
    return (
        a.in_flight == b.in_flight
        and a.queued == b.queued
        and a.ttft == b.ttft
        and a.e2e == b.e2e
        and a.admitted_total == b.admitted_total
        and a.completed_total == b.completed_total
        and a.rejected_total == b.rejected_total
    )


@dataclass(frozen=True, slots=True)
class LoggedDecision:
    """One decision as stored: its record with only what changed, and the tenants that left;
    or, in a key frame, whole (every tenant, none gone): a reader starts again from it."""

    record: DecisionRecord
    inputs_gone: tuple[str, ...]
    outputs_gone: tuple[str, ...]
    keyframe: bool = False


_Entry = LoggedDecision


class _Tenants:
    """Whole inputs and outputs at one point of the log, moved forward entry by entry."""

    def __init__(self) -> None:
        self.inputs: dict[str, TenantLoad] = {}
        self.outputs: dict[str, int] = {}

    def apply(self, entry: _Entry) -> None:
        if entry.keyframe:
            self.inputs.clear()
            self.outputs.clear()
        for name in entry.inputs_gone:
            self.inputs.pop(name, None)
        for name in entry.outputs_gone:
            self.outputs.pop(name, None)
        self.inputs.update(entry.record.inputs)
        self.outputs.update(entry.record.outputs)


class DecisionLog:
    """The most recent decisions of one pool, bounded, stored as changes.

    first_id: the id of the first decision (a restarted control plane continues above the ids
    it stored). on_logged: called with each entry as logged, on the caller's thread (it must not
    block: the decision loop calls append), every `keyframe_every`-th of them and the first
    whole (a key frame); None: entries stay in memory only.
    """

    def __init__(
        self,
        capacity: int,
        *,
        first_id: int = 1,
        on_logged: Callable[[LoggedDecision], None] | None = None,
        keyframe_every: int = 64,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if keyframe_every < 1:
            raise ValueError("keyframe_every must be at least 1")
        self._capacity = capacity
        self._on_logged = on_logged
        self._keyframe_every = keyframe_every
        self._since_keyframe: int | None = None
        """Entries sent to the sink since the last key frame; None: the next is one."""
        self._entries: deque[_Entry] = deque()
        self._base = _Tenants()
        """The tenants as they were before the oldest entry."""
        self._last = _Tenants()
        """The tenants as of the newest entry (what the next one is compared with)."""
        self._next_id = first_id
        self._enforced: dict[int, float] = {}
        """decision id -> wall-clock seconds when every gateway it changed had acknowledged it
        (as PoolState saw the acknowledgements), for the decisions the log holds."""

    @property
    def capacity(self) -> int:
        """The most decisions the log keeps."""
        return self._capacity

    def enforced(self, decision_id: int, at_wall_s: float) -> None:
        """Decision `decision_id` is enforced everywhere it changed something since `at_wall_s`."""
        self._enforced[decision_id] = at_wall_s

    def enforced_at(self, decision_id: int) -> float | None:
        """When decision `decision_id` was enforced everywhere it changed something; None: not
        yet, it changed no limit, or it has left the log."""
        return self._enforced.get(decision_id)

    def request_keyframe(self) -> None:
        """Send the next entry to the sink whole (the sink lost some: a reader must not rebuild
        across the gap)."""
        self._since_keyframe = None

    def next_id(self) -> int:
        """Reserve the id of the next decision."""
        decision_id = self._next_id
        self._next_id += 1
        return decision_id

    def append(self, record: DecisionRecord) -> None:
        """Log `record` (whole inputs and outputs); only what changed is kept."""
        last = self._last
        changed_inputs = {
            name: load
            for name, load in record.inputs.items()
            if (held := last.inputs.get(name)) is None or not same_figures(held, load)
        }
        changed_outputs = {
            name: limit for name, limit in record.outputs.items() if last.outputs.get(name) != limit
        }
        entry = _Entry(
            dataclasses.replace(record, inputs=changed_inputs, outputs=changed_outputs),
            inputs_gone=tuple(n for n in last.inputs if n not in record.inputs),
            outputs_gone=tuple(n for n in last.outputs if n not in record.outputs),
        )
        last.apply(entry)
        self._entries.append(entry)
        if len(self._entries) > self._capacity:
            gone = self._entries.popleft()
            self._base.apply(gone)
            self._enforced.pop(gone.record.id, None)
        if self._on_logged is not None:
            self._on_logged(self._for_sink(entry))

    def _for_sink(self, entry: _Entry) -> LoggedDecision:
        since = self._since_keyframe
        if since is not None and since + 1 < self._keyframe_every:
            self._since_keyframe = since + 1
            return entry
        self._since_keyframe = 0
        whole = dataclasses.replace(
            entry.record, inputs=dict(self._last.inputs), outputs=dict(self._last.outputs)
        )
        return LoggedDecision(whole, inputs_gone=(), outputs_gone=(), keyframe=True)

    def newest(self, limit: int, *, changes_only: bool = False) -> list[DecisionRecord]:
        """Up to `limit` records, newest first: whole, or with `changes_only` as stored (each
        naming only the tenants whose figures or limits changed since the decision before it).
        A whole read costs the changes since the oldest entry plus `limit` x the tenants."""
        if limit <= 0:
            return []
        entries = list(self._entries)
        if changes_only:
            return [e.record for e in reversed(entries[-limit:])]
        state = _Tenants()
        state.inputs.update(self._base.inputs)
        state.outputs.update(self._base.outputs)
        first = max(0, len(entries) - limit)
        records: list[DecisionRecord] = []
        for index, entry in enumerate(entries):
            state.apply(entry)
            if index >= first:
                records.append(
                    dataclasses.replace(
                        entry.record, inputs=dict(state.inputs), outputs=dict(state.outputs)
                    )
                )
        records.reverse()
        return records

    def __len__(self) -> int:
        return len(self._entries)


def rebuild(
    entries: Iterable[LoggedDecision], *, from_id: int, changes_only: bool = False
) -> list[DecisionRecord]:
    """The records of `entries` (stored ones, in id order, from a key frame on) whose id is at
    least `from_id`, oldest first: whole (each tenant's figures and limit as of that decision),
    or with `changes_only` as stored. Entries before the first key frame are rebuilt from
    nothing: a reader that starts there sees only what they changed."""
    state = _Tenants()
    records: list[DecisionRecord] = []
    for entry in entries:
        state.apply(entry)
        if entry.record.id < from_id:
            continue
        if changes_only:
            records.append(entry.record)
        else:
            records.append(
                dataclasses.replace(
                    entry.record, inputs=dict(state.inputs), outputs=dict(state.outputs)
                )
            )
    return records
