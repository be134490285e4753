"""The registry of allocation policies, by the names the config uses."""

from __future__ import annotations

from collections.abc import Callable

from controlplane.core.agent_policy import AgentPolicy
from controlplane.core.demand_policy import DemandPolicy
from controlplane.core.policy import AllocationPolicy
from controlplane.core.slo_policy import SloPolicy
from controlplane.core.static_policy import StaticPolicy

POLICY_FACTORIES: dict[str, Callable[[], AllocationPolicy]] = {
    "static": StaticPolicy,
    "demand": DemandPolicy,
    "slo": SloPolicy,
}


def make_policy(name: str, *, fallback: str = "slo") -> AllocationPolicy:
    """A new instance of the policy called `name`; ValueError names the known ones otherwise.

    fallback: for the agent policy, the rule-based policy that decides when the agent cannot.
    """
    if name == "agent":
        if fallback == "agent":
            raise ValueError("the agent policy cannot fall back to itself")
        return AgentPolicy(make_policy(fallback))
    try:
        factory = POLICY_FACTORIES[name]
    except KeyError:
        known = sorted([*POLICY_FACTORIES, "agent"])
        raise ValueError(f"unknown policy {name!r}; known: {known}") from None
    return factory()
