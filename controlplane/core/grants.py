"""Granting limits so that the pool never has more than its budget in flight.

A gateway that is told to shrink keeps running what it admitted (shrinking never kills a
request), and a push reaches gateways at different moments. So a tenant's new, larger part on one
gateway is only granted as fast as the slots given up elsewhere are known to be free. The control
plane tracks for each (gateway, tenant) cell an upper bound on what it may hold: the largest limit
the gateway may be enforcing (acknowledged, or sent and not yet acknowledged) or what it reported
in flight, whichever is more. The bounds never sum above the budget; grants are raised only within
what that leaves.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from slotshift.apportion import Claim, apportion

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Cell:
    """One gateway's view of one tenant."""

    target: int
    """Its part of the tenant's limit under the latest decision."""
    granted: int
    """The limit last sent to the gateway."""
    bound: int
    """Most the gateway may be holding now (see the module docstring)."""


def compute_grants(budget: int, cells: Mapping[Key, Cell]) -> dict[Key, int]:
    """New limits for every cell.

    Contract (tests/unit/controlplane/test_grants.py):
    - each grant lies in [0, target];
    - a cell above its target is cut to it at once (the gateway stops admitting until it fits);
    - the sum over cells of max(bound, grant) stays within max(budget, sum of bounds): a grant
      only rises into capacity that no cell may be holding;
    - when the bounds leave room for every target, every grant equals its target;
    - deterministic: keys are visited in sorted order.
    """
    keys = sorted(cells, key=repr)
    grants: dict[Key, int] = {}
    for key in keys:
        cell = cells[key]
        bound = max(cell.bound, cell.granted)
        kept = min(cell.target, cell.granted)
        # Up to the bound a raise costs nothing: the slots are counted as held already.
        grants[key] = max(kept, min(cell.target, bound))
    headroom = budget - sum(max(cells[k].bound, cells[k].granted) for k in keys)
    wanting = [k for k in keys if cells[k].target > grants[k]]
    if headroom <= 0 or not wanting:
        return grants
    deficits = [cells[k].target - grants[k] for k in wanting]
    extra = apportion(min(headroom, sum(deficits)), [Claim(0, d, float(d)) for d in deficits])
    for key, more in zip(wanting, extra, strict=True):
        grants[key] += more
    return grants
