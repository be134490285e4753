"""What the twin assumes beyond the scenario and the stack's config: the network and the start."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class TwinSettings(BaseModel):
    """The twin's own knobs; everything else comes from the scenario and the stack's config,
    as `slotshift bench` would configure the stack."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    transit_ms: Annotated[float, Field(ge=0)] = 1.0
    """One-way delay of every message between a gateway and the control plane (hello, report,
    ack, allocation push), in milliseconds: a loopback gRPC hop on one host, as the live bench
    runs them."""

    load_starts_after_s: Annotated[float, Field(ge=0)] = 2.0
    """Seconds between the stack's start (the control plane's restart hold begins then) and
    the first request, as the live bench waits for the stack to be ready."""

    closed_form: bool = True
    """Jump over the engine's decode-only stretches at once (EngineCore.advance_decodes);
    false: run every engine step (the same figures, slower: the check of the jump)."""
