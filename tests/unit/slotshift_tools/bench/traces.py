"""Hand-made request traces for the statistics tests."""

from __future__ import annotations

from slotshift_tools.bench.trace import RequestStatus, RequestTrace


def done(
    tenant: str,
    start_s: float,
    ttft_s: float,
    itl_s: list[float],
    *,
    prompt_tokens: int = 10,
    tail_s: float = 0.0,
) -> RequestTrace:
    """A completed request: its first chunk after ttft_s, then one chunk per gap; it ends
    tail_s after its last chunk; output tokens = chunks."""
    first = start_s + ttft_s
    return RequestTrace(
        tenant=tenant,
        gateway=0,
        prompt_tokens=prompt_tokens,
        max_tokens=len(itl_s) + 1,
        start_s=start_s,
        first_token_s=first,
        end_s=first + sum(itl_s) + tail_s,
        output_tokens=len(itl_s) + 1,
        itl_s=list(itl_s),
        status=RequestStatus.OK,
    )


def failed(tenant: str, start_s: float, end_s: float) -> RequestTrace:
    trace = RequestTrace(tenant=tenant, gateway=0, prompt_tokens=10, max_tokens=5, start_s=start_s)
    trace.fail(end_s, "HTTP 429: queue full", 429)
    return trace


def cancelled(tenant: str, start_s: float, end_s: float, itl_s: list[float]) -> RequestTrace:
    return RequestTrace(
        tenant=tenant,
        gateway=0,
        prompt_tokens=10,
        max_tokens=100,
        start_s=start_s,
        first_token_s=start_s + 0.1,
        end_s=end_s,
        itl_s=list(itl_s),
        status=RequestStatus.CANCELLED,
    )
