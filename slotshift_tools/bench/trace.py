"""What one request did, seen from the client: the raw material of every latency and throughput.

Times are seconds on the harness's monotonic clock, measured from the start of the load (the
start of the warm-up), so a trace file reads on its own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    PENDING = "pending"
    """Sent, no answer yet."""
    OK = "ok"
    """Answered in full: the stream ended with [DONE]."""
    FAILED = "failed"
    """Refused (an HTTP error), broken off (an error event, a stream cut short, a connection
    error) or timed out."""
    CANCELLED = "cancelled"
    """Still running when the load stopped; never counted."""


@dataclass(slots=True)
class RequestTrace:
    """One request, from sending to its last byte."""

    tenant: str
    """The scenario's tenant that sent it (in the pool baseline too, where the pool sees one)."""
    gateway: int
    """Index of the gateway it was sent to."""
    prompt_tokens: int
    max_tokens: int
    start_s: float
    """When it was sent."""
    first_token_s: float | None = None
    """When the first chunk with output text arrived."""
    end_s: float | None = None
    """When it ended: its last byte, its failure, or its cancellation."""
    output_tokens: int = 0
    """Output tokens received: the usage the server reports, else the chunks counted."""
    itl_s: list[float] = field(default_factory=list)
    """Gaps between consecutive output chunks after the first (inter-token latencies)."""
    status: RequestStatus = RequestStatus.PENDING
    http_status: int | None = None
    error: str | None = None
    """Why it failed, briefly."""
    pool: str | None = None
    """The pool the gateway sent it to (fleet scenarios); None: a one-pool scenario, or refused
    before it was routed."""

    @property
    def ttft_s(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def e2el_s(self) -> float | None:
        """End-to-end latency."""
        return None if self.end_s is None else self.end_s - self.start_s

    def fail(self, end_s: float, error: str, http_status: int | None = None) -> None:
        """Mark it failed; http_status: the refusal's, if any (a stream broken off after a 200
        keeps its 200)."""
        self.status = RequestStatus.FAILED
        self.end_s = end_s
        self.error = error
        if http_status is not None:
            self.http_status = http_status

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (one line of traces.jsonl); ITLs in milliseconds."""
        return {
            "tenant": self.tenant,
            "gateway": self.gateway,
            "status": self.status.value,
            "http_status": self.http_status,
            "error": self.error,
            "start_s": self.start_s,
            "first_token_s": self.first_token_s,
            "end_s": self.end_s,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "output_tokens": self.output_tokens,
            "itl_ms": [round(gap * 1000.0, 3) for gap in self.itl_s],
            # Only a fleet's requests name their pool: one-pool traces keep their shape.
            **({} if self.pool is None else {"pool": self.pool}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestTrace:
        return cls(
            tenant=data["tenant"],
            gateway=data["gateway"],
            prompt_tokens=data["prompt_tokens"],
            max_tokens=data["max_tokens"],
            start_s=data["start_s"],
            first_token_s=data["first_token_s"],
            end_s=data["end_s"],
            output_tokens=data["output_tokens"],
            itl_s=[gap / 1000.0 for gap in data["itl_ms"]],
            status=RequestStatus(data["status"]),
            http_status=data["http_status"],
            error=data["error"],
            pool=data.get("pool"),
        )
