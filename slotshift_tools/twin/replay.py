"""Recorded traffic for the twin: request logs (slotshift/request_log.py) read, merged and turned
into every tenant's sends (slotshift_tools/replay.py), checked against the scenario that gives
the pool, tenants, policies and config.

`replayed_traffic` is what `slotshift simulate SCENARIO.yaml --replay LOG [LOG ...]` runs: the
log gives the traffic (each tenant's sends replace its arrival process), the run's horizon is the
log's span, from its first replayed arrival to its last request's end (so that every recorded
request can end inside it). What a replay cannot know is in slotshift_tools/replay.py's
docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotshift.request_log import Outcome, RequestLogError, merge_logs
from slotshift_tools.bench.scenario import Scenario
from slotshift_tools.replay import ReplayedRequest, ReplaySchedule, replay_schedule


class ReplayError(ValueError):
    """A log that cannot be replayed in this scenario (the message says why)."""


@dataclass(frozen=True)
class ReplayedTraffic:
    """A log's traffic, ready for the twin's load."""

    schedule: ReplaySchedule
    files: tuple[Path, ...]
    pool: str
    """The pool whose records are replayed."""
    span_s: float
    """The run's horizon: seconds from the first replayed arrival to the last request's end."""
    silent_tenants: tuple[str, ...]
    """The scenario's tenants the log has no request of: they send nothing."""

    @property
    def sends(self) -> dict[str, tuple[ReplayedRequest, ...]]:
        """Each tenant's sends, for `LoadGenerator(schedule=...)`."""
        return {name: tenant.requests for name, tenant in self.schedule.tenants.items()}

    def meta(self) -> dict[str, Any]:
        """summary.json's `meta.replay`."""
        return {
            "files": [str(path) for path in self.files],
            "pool": self.pool,
            "origin_unix_s": self.schedule.origin_unix_s,
            "span_s": self.span_s,
            "requests": {name: len(t.requests) for name, t in self.schedule.tenants.items()},
            "silent_tenants": list(self.silent_tenants),
            "left_out": dict(self.schedule.left_out),
        }


def replayed_traffic(
    paths: Sequence[Path], scenario: Scenario, *, pool: str | None = None
) -> ReplayedTraffic:
    """The traffic of the logs at `paths` (several gateways' files, rotated parts too) for a run
    of `scenario`: the records of `pool` (None: the log's only pool), every one whose lengths
    are known (see replay_schedule). ReplayError when a log cannot be read, holds no request to
    replay, holds several pools and none was named, or names a tenant the scenario does not
    have (each such tenant named)."""
    if not paths:
        raise ReplayError("no request log given")
    try:
        records = list(merge_logs(paths))
    except RequestLogError as exc:
        raise ReplayError(str(exc)) from exc
    replayable = [r for r in records if r.outcome is not Outcome.INVALID]
    pools = sorted({r.pool for r in replayable})
    if pool is None:
        if len(pools) > 1:
            raise ReplayError(f"the log holds several pools ({', '.join(pools)}): name one")
        if not pools:
            raise ReplayError("the log holds no request to replay")
        pool = pools[0]
    of_pool = [r for r in replayable if r.pool == pool]
    if not of_pool:
        raise ReplayError(f"the log holds no request of pool {pool!r} (its pools: {pools})")
    names = [t.name for t in scenario.tenants]
    strangers = sorted({r.tenant for r in of_pool} - set(names))
    if strangers:
        raise ReplayError(
            f"the log's tenants {', '.join(strangers)} are not in scenario {scenario.name}"
            f" (its tenants: {', '.join(names)})"
        )
    # Just past the last end, so that a request recorded as ending at its arrival is replayed.
    end_unix_s = math.nextafter(max(r.ended_unix_s for r in of_pool), math.inf)
    schedule = replay_schedule(records, pool=pool, end_unix_s=end_unix_s)
    if not schedule.requests:
        raise ReplayError(
            f"none of the log's requests can be replayed (left out: {schedule.left_out})"
        )
    return ReplayedTraffic(
        schedule=schedule,
        files=tuple(paths),
        pool=pool,
        span_s=schedule.horizon_s,
        silent_tenants=tuple(n for n in names if n not in schedule.tenants),
    )
