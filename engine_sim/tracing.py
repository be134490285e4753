"""The emulator's span of one request, as vLLM makes it with --otlp-traces-endpoint.

vLLM continues the caller's W3C trace context (the gateway's `traceparent`) with a server span
named "llm_request" that carries the request's token counts and latencies as `gen_ai.*`
attributes. The emulator makes the same span, so that a trace reads the same on the emulator as
on a real engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace

from engine_sim.engine_core import FinishedRequest, FinishReason
from engine_sim.openai_api import GenerationRequest
from slotshift.trace_context import parent_from

LLM_REQUEST_SPAN = "llm_request"
"""vLLM's name for the span of one request."""


@contextmanager
def llm_request_span(
    tracer: trace.Tracer,
    headers: Mapping[str, str],
    *,
    request_id: str,
    model: str,
    generation: GenerationRequest,
) -> Iterator[trace.Span]:
    """The request's span, the child of the trace context its headers carry (if any)."""
    with tracer.start_as_current_span(
        LLM_REQUEST_SPAN,
        context=parent_from(headers),
        kind=trace.SpanKind.SERVER,
        attributes={
            "gen_ai.request.id": request_id,
            "gen_ai.response.model": model,
            "gen_ai.request.max_tokens": generation.max_tokens,
            "gen_ai.usage.prompt_tokens": generation.prompt_tokens,
        },
    ) as span:
        yield span


def record_finished(span: trace.Span, finished: FinishedRequest | None) -> None:
    """How the request left the engine: output tokens, time queued in the engine, end to end.
    `finished` is None when the handler ended before the engine said (client gone, stopping)."""
    if finished is None:
        span.set_attribute("gen_ai.response.finish_reasons", [FinishReason.ABORT.value])
        return
    span.set_attributes(
        {
            "gen_ai.usage.completion_tokens": finished.output_tokens,
            "gen_ai.response.finish_reasons": [finished.reason.value],
            "gen_ai.latency.e2e": finished.e2e_s,
        }
    )
    if finished.queued_s is not None:
        span.set_attribute("gen_ai.latency.time_in_queue", finished.queued_s)
