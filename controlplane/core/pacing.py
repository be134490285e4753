"""Pacing of work whose cost grows with the pool: how long to rest before running it again.

Pure: times in, seconds out.
"""

from __future__ import annotations


def paced_rest_s(began_s: float, ended_s: float, min_interval_s: float, max_cores: float) -> float:
    """How long work that ran from `began_s` to `ended_s` rests before it runs again: until
    `min_interval_s` after it began, and at least as long as keeps it within `max_cores` of one
    core (work that took d seconds rests d / max_cores - d). Times are the injected clock's:
    under a virtual clock the work takes no time and only the interval paces it, so the
    deterministic twin stays deterministic. At most 0: run again at once."""
    spent_s = max(0.0, ended_s - began_s)
    return max(began_s + min_interval_s - ended_s, spent_s / max_cores - spent_s)
