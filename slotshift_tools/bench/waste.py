"""Waste: engine work that no client received, from the engine's and the gateways' own counters.

Issue 12's definition: waste = output tokens discarded by restarts + prompt tokens recomputed on
resume that were not prefix-cache hits. Both are measured over the span between the first and
the last sample inside the steady window that read the counters (the sample interval is the
resolution of the span's ends), each end at the moment the counters were read (a sample's
engine or gateway reading comes after its control-plane reading, tens of milliseconds on a busy
host: enough admissions to matter).

Pool level, from the engine's /metrics (vLLM's names; the emulator exports the same):
- discarded output = the increase of `vllm:generation_tokens_total` minus the output tokens the
  clients received in the span (a completed request's output tokens spread evenly over its
  text chunks; one token a chunk for a request still running at the span's end, which has no
  usage yet: exact for one token a chunk, as vLLM and the emulator stream);
- recomputed prompt = the increase of `vllm:prefix_cache_queries_total` minus that of
  `vllm:prefix_cache_hits_total` (prompt tokens the engine computed), minus the prompt tokens of
  the requests whose first token arrived in the span. The first token marks the request's first
  prefill, within one engine step; every further prefill of it is a resume. Approximations: a
  fresh prompt is taken to miss the cache (the bench's prompts are random token ids), and a
  first prefill whose first token arrives across a span's end counts on the wrong side.
Each term is clamped at 0 (the client's and the engine's clocks read the span's ends a few
milliseconds apart), and is None when a counter is absent: no reading is not no waste.

Per tenant, from the gateways' `slotshift_gateway_waste_tokens_total{tenant,kind}` (kind
`discarded_output` or `recomputed_prompt`), summed over the gateways: the increase over the same
kind of span. None when the gateways do not export the counter. The gateways count from the
usage an engine reports: where it reports no `prompt_tokens_details.cached_tokens`, a resume's
whole prompt counts as recomputed (an upper bound; the pool's figure is the engine's own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.stats import Window, chunk_times_s
from slotshift_tools.bench.trace import RequestStatus, RequestTrace

DISCARDED_OUTPUT = "discarded_output"
RECOMPUTED_PROMPT = "recomputed_prompt"
WASTE_KINDS = (DISCARDED_OUTPUT, RECOMPUTED_PROMPT)
"""The `kind` label values of the gateways' waste counter."""

WASTE_FIELDS = (
    "waste_tokens",
    "waste_percent",
    "waste_discarded_output_tokens",
    "waste_recomputed_prompt_tokens",
)
"""The summary's waste figures, total and per tenant (see Waste)."""


@dataclass(frozen=True)
class Waste:
    """Wasted tokens over a span, and the output the clients received in it."""

    discarded_output_tokens: float | None
    """Output tokens the engine generated that no client received; None: not measured."""
    recomputed_prompt_tokens: float | None
    """Prompt tokens computed again on a resume or restart, not prefix-cache hits; None: not
    measured."""
    received_output_tokens: float | None
    """Output tokens the clients received in the same span; None: no span."""

    @property
    def tokens(self) -> float | None:
        """Both kinds together; None unless both were measured."""
        if self.discarded_output_tokens is None or self.recomputed_prompt_tokens is None:
            return None
        return self.discarded_output_tokens + self.recomputed_prompt_tokens

    @property
    def percent(self) -> float | None:
        """`tokens` in percent of the output received; None without both, or with no output."""
        tokens = self.tokens
        if tokens is None or not self.received_output_tokens:
            return None
        return 100.0 * tokens / self.received_output_tokens

    def figures(self) -> dict[str, float | None]:
        """The summary's WASTE_FIELDS."""
        return {
            "waste_tokens": self.tokens,
            "waste_percent": self.percent,
            "waste_discarded_output_tokens": self.discarded_output_tokens,
            "waste_recomputed_prompt_tokens": self.recomputed_prompt_tokens,
        }


NO_WASTE_READING = Waste(None, None, None)
"""What is known without any reading."""


def received_tokens(trace: RequestTrace, span: Window) -> float:
    """Output tokens of one request that arrived in the span: its chunks there, each carrying an
    even part of a completed request's output tokens (its usage), or one token each for a
    request that did not complete (it records no usage)."""
    times = chunk_times_s(trace)
    if not times:
        return 0.0
    inside = sum(1 for t in times if span.holds(t))
    if trace.status is RequestStatus.OK and trace.output_tokens > 0:
        return inside * trace.output_tokens / len(times)
    return float(inside)


def first_prefill_prompt_tokens(traces: Iterable[RequestTrace], span: Window) -> int:
    """Prompt tokens of the requests whose first token arrived in the span."""
    return sum(
        t.prompt_tokens
        for t in traces
        if t.first_token_s is not None and span.holds(t.first_token_s)
    )


def pool_waste(samples: Sequence[Sample], traces: Sequence[RequestTrace], window: Window) -> Waste:
    """The pool's waste over the window, from the engine's counters and every request's trace
    (see the module's doc)."""
    readings = [
        s for s in samples if window.holds(s.t_s) and s.engine_generation_tokens is not None
    ]
    span = _span(readings, [s.engine_read_s for s in readings])
    if span is None:
        return NO_WASTE_READING
    first, last = readings[0], readings[-1]
    received = sum(received_tokens(t, span) for t in traces)
    generated = _increase(first.engine_generation_tokens, last.engine_generation_tokens)
    discarded = None if generated is None else max(0.0, generated - received)
    computed = _increase(_misses(first), _misses(last))
    recomputed = (
        None if computed is None else max(0.0, computed - first_prefill_prompt_tokens(traces, span))
    )
    return Waste(discarded, recomputed, received)


def tenant_waste(
    samples: Sequence[Sample],
    traces: Sequence[RequestTrace],
    window: Window,
    tenant: str,
) -> Waste:
    """One tenant's waste over the window, from the gateways' counters under its name; its
    received output from its own traces."""
    readings = [s for s in samples if window.holds(s.t_s) and s.gateway_waste_tokens is not None]
    span = _span(readings, [s.gateway_read_s for s in readings])
    if span is None:
        return NO_WASTE_READING
    first, last = readings[0].gateway_waste_tokens, readings[-1].gateway_waste_tokens
    assert first is not None and last is not None  # the readings were chosen so
    kinds = {
        kind: max(0.0, _kind(last, tenant, kind) - _kind(first, tenant, kind))
        for kind in WASTE_KINDS
    }
    received = sum(received_tokens(t, span) for t in traces if t.tenant == tenant)
    return Waste(kinds[DISCARDED_OUTPUT], kinds[RECOMPUTED_PROMPT], received)


def _span(readings: Sequence[Sample], read_s: Sequence[float | None]) -> Window | None:
    """From the first reading to the last, at their read times (their t_s when not known)."""
    if len(readings) < 2:
        return None
    start_s = read_s[0] if read_s[0] is not None else readings[0].t_s
    end_s = read_s[-1] if read_s[-1] is not None else readings[-1].t_s
    return Window(start_s, end_s) if end_s > start_s else None


def _misses(sample: Sample) -> float | None:
    if sample.engine_prefix_cache_queries is None or sample.engine_prefix_cache_hits is None:
        return None
    return sample.engine_prefix_cache_queries - sample.engine_prefix_cache_hits


def _increase(first: float | None, last: float | None) -> float | None:
    return None if first is None or last is None else last - first


def _kind(reading: Mapping[str, Mapping[str, float]], tenant: str, kind: str) -> float:
    # A labelled counter shows a (tenant, kind) only once it is first counted: absent is 0.
    return reading.get(tenant, {}).get(kind, 0.0)
