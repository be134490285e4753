"""Which pool serves a request: by its `model`, among the pools its tenant may use.

A gateway fronts one or more pools; each pool lists the models its engine serves
(`pools[].models`), and a tenant may use the models of the pools it is a tenant of. Pools that
serve the same model are replicas of it: a request goes to the replica where its tenant has the
most room at this gateway now (its limit there less what it runs and queues), ties to the one
where it runs least, then to the first in the gateway's config. A pool that names no model
serves whatever a request names; only a gateway fronting that pool alone has one.

Pure: the pools' views in, a pool's name out, or the refusal to answer with (proxy.py turns
them into OpenAI-style 404 and 400 answers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Front(Protocol):
    """One pool as the router sees it at this gateway."""

    @property
    def name(self) -> str: ...

    @property
    def models(self) -> tuple[str, ...]:
        """The models its engine serves; empty: whatever a request names."""
        ...

    def room(self, tenant: str) -> tuple[int, int] | None:
        """(limit less in flight less queued, in flight) of `tenant` here; None: the tenant may
        not use this pool."""
        ...

    @property
    def available(self) -> bool:
        """False while its engine could not be reached lately: passed over while a replica
        that is available serves the model."""
        ...


class RoutingError(Exception):
    """A request no pool can take; the message is safe to show to the client."""


class ModelNotFound(RoutingError):
    """The model is unknown, or not one the tenant may use (the answer does not say which)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model {model!r} does not exist or you do not have access to it.")
        self.model = model


class ModelRequired(RoutingError):
    """The request names no model and the tenant may use several (or none)."""

    def __init__(self, models: Sequence[str]) -> None:
        known = ", ".join(models) if models else "none"
        super().__init__(f"The request names no model; yours are: {known}.")
        self.models = tuple(models)


@dataclass(frozen=True, slots=True)
class Routed:
    pool: str
    model: str | None
    """The model the request is served as (the one it named, or the tenant's only one)."""


def tenant_models(fronts: Sequence[Front], tenant: str) -> list[str]:
    """The models `tenant` may use, in the order of the gateway's pools and their models."""
    models: list[str] = []
    for front in fronts:
        if front.room(tenant) is None:
            continue
        models.extend(m for m in front.models if m not in models)
    return models


def route(fronts: Sequence[Front], tenant: str, model: str | None, turn: int = 0) -> Routed:
    """The pool for a request of `tenant` naming `model` (None: it names none).

    Contract (tests/unit/admission_gateway/test_routing.py):
    - only pools the tenant may use are candidates; of those, the ones serving `model` (a pool
      naming no model serves any);
    - no model named: the tenant's only model (the first name of every pool it may use: the
      others are aliases), or, with one pool that names none, that pool; else ModelRequired;
    - no candidate serves the model: ModelNotFound, whether the model exists or not;
    - candidates that are not `available` only when none is;
    - among candidates, the most room, then the fewest in flight; replicas tied on both take
      turns: the `turn`-th of them (modulo their number, in config order), so that a caller
      counting its requests spreads a light load evenly.
    """
    usable = [(front, room) for front in fronts if (room := front.room(tenant)) is not None]
    if model is None:
        if len(usable) == 1 and not usable[0][0].models:
            return Routed(usable[0][0].name, None)
        # A pool's first name is its model; the others are aliases of it.
        canonical = {front.models[0] for front, _ in usable if front.models}
        if len(canonical) != 1 or any(not front.models for front, _ in usable):
            raise ModelRequired(tenant_models(fronts, tenant))
        model = canonical.pop()
    serving = [(f, room) for f, room in usable if not f.models or model in f.models]
    if not serving:
        raise ModelNotFound(model)
    # A replica whose engine cannot be reached is no choice while another can take the request;
    # with none available, the request tries its luck as if all were.
    serving = [(f, room) for f, room in serving if f.available] or serving
    best = max((room[0], -room[1]) for _, room in serving)
    tied = [f for f, room in serving if (room[0], -room[1]) == best]
    return Routed(tied[turn % len(tied)].name, model)
