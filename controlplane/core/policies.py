"""The registry of allocation policies, by the names the config uses."""

from __future__ import annotations

from collections.abc import Callable

from controlplane.core.demand_policy import DemandPolicy
from controlplane.core.policy import AllocationPolicy
from controlplane.core.slo_policy import SloPolicy
from controlplane.core.static_policy import StaticPolicy

POLICY_FACTORIES: dict[str, Callable[[], AllocationPolicy]] = {
    "static": StaticPolicy,
    "demand": DemandPolicy,
    "slo": SloPolicy,
}


def make_policy(name: str) -> AllocationPolicy:
    """A new instance of the policy called `name`; ValueError names the known ones otherwise."""
    try:
        factory = POLICY_FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {sorted(POLICY_FACTORIES)}") from None
    return factory()
