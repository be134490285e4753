"""Pausing and resuming preemptible tenants' borrowed work (docs/preemption.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from slotshift.config.base import ConfigModel, PositiveSeconds


class PreemptionConfig(ConfigModel):
    """Pausing preemptible tenants' borrowed work so that a lender gets its slots back at once."""

    enabled: bool = True
    """Pause borrowed work of preemptible tenants when a lender is owed slots; off, a lent slot
    comes back only when the borrower's request in it ends."""

    max_pauses_per_request: Annotated[int, Field(ge=0)] = 2
    """Most times one request is paused; a request paused that often runs to its end, so that a
    resumed request is not the youngest victim of every burst."""

    max_waste_percent: Annotated[float, Field(ge=0, le=100)] = 3.0
    """Most waste (output tokens discarded by restarts, plus prompt tokens recomputed on resume
    that were not prefix-cache hits) the pool accepts, in percent of its output tokens over the
    last `waste_window_s`; above it the control plane waits for borrowed work to end instead of
    pausing it. The waste is charged to the pool, never to a tenant."""

    waste_window_s: PositiveSeconds = 60.0
    """The window over which the waste share is measured."""
