"""The gateway's Prometheus metrics, in a registry of its own (one per gateway instance).

Gauges and counters of admission state are read from GatewayState when scraped, so there is one
source of truth and nothing to keep in step; latency histograms are observed as requests pass.

Names follow one scheme across the services (docs/operations.md lists them all): quantities of
slots end in `_slots` and are prefixed `tenant_`, counts of requests start with `requests_`,
durations end in `_seconds`, counters in `_total`; every per-tenant series has `pool` and `tenant`.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from admission_gateway.admission import REJECTION_REASONS
from admission_gateway.gateway_state import GatewayState

_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """The metrics of one gateway; `exposition()` is what /metrics serves."""

    def __init__(self, *states: GatewayState) -> None:
        """The metrics of a gateway fronting the pools of `states`, one state each."""
        self.registry = CollectorRegistry()
        labels = ["pool", "tenant"]
        self.queue_wait = Histogram(
            "slotshift_gateway_queue_wait_seconds",
            "Time admitted requests waited in the gateway's queue for a slot.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "slotshift_gateway_time_to_first_token_seconds",
            "From arrival at the gateway to the first streamed chunk carrying generated content.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.e2e_latency = Histogram(
            "slotshift_gateway_e2e_request_latency_seconds",
            "From arrival at the gateway to the last byte of a successful response.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        for state in states:
            self.registry.register(_StateCollector(state))

        # Each histogram's series by (pool, tenant): `labels` checks and joins its values on
        # every call, which every request pays three times.
        self._series: dict[tuple[Histogram, str, str], Histogram] = {}

    def observe_queue_wait(self, pool: str, tenant: str, seconds: float) -> None:
        self._of(self.queue_wait, pool, tenant).observe(seconds)

    def observe_time_to_first_token(self, pool: str, tenant: str, seconds: float) -> None:
        self._of(self.time_to_first_token, pool, tenant).observe(seconds)

    def observe_e2e_latency(self, pool: str, tenant: str, seconds: float) -> None:
        self._of(self.e2e_latency, pool, tenant).observe(seconds)

    def _of(self, histogram: Histogram, pool: str, tenant: str) -> Histogram:
        key = (histogram, pool, tenant)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = histogram.labels(pool, tenant)
        return series

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Reads limits, usage and counters from the gateway state at scrape time."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        pool = self._state.pool_name
        labels = ["pool", "tenant"]
        limit = GaugeMetricFamily(
            "slotshift_gateway_tenant_limit_slots",
            "Slots the tenant's admitted requests may hold at once at this gateway now (one "
            "per request unless the pool weighs requests).",
            labels=labels,
        )
        target = GaugeMetricFamily(
            "slotshift_gateway_tenant_target_slots",
            "This gateway's part of the tenant's pool-wide limit.",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "slotshift_gateway_requests_in_flight",
            "Requests admitted and not finished.",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            "slotshift_gateway_requests_queued", "Requests waiting for a slot.", labels=labels
        )
        slots_in_flight = GaugeMetricFamily(
            "slotshift_gateway_in_flight_slots",
            "Slots held by admitted requests (requests_in_flight unless the pool weighs "
            "requests): what the budget counts.",
            labels=labels,
        )
        slots_queued = GaugeMetricFamily(
            "slotshift_gateway_queued_slots",
            "Slots the waiting requests will hold (requests_queued unless the pool weighs "
            "requests).",
            labels=labels,
        )
        admitted = CounterMetricFamily(
            "slotshift_gateway_requests_admitted", "Requests admitted.", labels=labels
        )
        completed = CounterMetricFamily(
            "slotshift_gateway_requests_completed",
            "Admitted requests that have finished, whatever their outcome.",
            labels=labels,
        )
        rejected = CounterMetricFamily(
            "slotshift_gateway_requests_rejected",
            "Requests turned away before admission, by reason.",
            labels=[*labels, "reason"],
        )
        abandoned = CounterMetricFamily(
            "slotshift_gateway_requests_abandoned",
            "Queued requests whose client went away before they were admitted.",
            labels=labels,
        )
        paused = GaugeMetricFamily(
            "slotshift_gateway_requests_paused",
            "Paused requests waiting to resume (counted as queued too).",
            labels=labels,
        )
        pauses = CounterMetricFamily(
            "slotshift_gateway_pauses",
            "Times a running request was paused so that a lender got its slots back.",
            labels=labels,
        )
        output_tokens = CounterMetricFamily(
            "slotshift_gateway_output_tokens",
            "Output tokens of the requests the gateway reads (preemptible tenants' requests).",
            labels=labels,
        )
        waste = CounterMetricFamily(
            "slotshift_gateway_waste_tokens",
            "Tokens lost to pauses: output discarded by restarts, prompt recomputed on resume "
            "(not prefix-cache hits). Charged to the pool, never to the tenant's usage.",
            labels=[*labels, "kind"],
        )
        moved = CounterMetricFamily(
            "slotshift_gateway_requests_moved",
            "Resumable requests moved between replicas of a model because an engine was lost: "
            "`out` of this pool (its engine went away under them), `in` to it (they went on "
            "here).",
            labels=[*labels, "direction"],
        )
        tokens = CounterMetricFamily(
            "slotshift_gateway_tokens",
            "Tokens of the tenant's answered requests, by model and kind (prompt, completion): "
            "the engine's usage, or the content events of a stream cut before it (a lower "
            "bound). The model is the pool's (its first name), or for a pool naming none the "
            "one the request named.",
            labels=[*labels, "model", "kind"],
        )
        for name, tenant in self._state.tenants.items():
            admission = tenant.admission
            for model, totals in tenant.tokens.items():
                tokens.add_metric([pool, name, model, "prompt"], totals.prompt_tokens_total)
                tokens.add_metric([pool, name, model, "completion"], totals.completion_tokens_total)
            moved.add_metric([pool, name, "out"], tenant.moved_out_total)
            moved.add_metric([pool, name, "in"], tenant.moved_in_total)
            paused.add_metric([pool, name], admission.paused_requests)
            pauses.add_metric([pool, name], admission.pauses_total)
            output_tokens.add_metric([pool, name], tenant.output_tokens_total)
            waste.add_metric([pool, name, "discarded_output"], tenant.discarded_output_tokens_total)
            waste.add_metric(
                [pool, name, "recomputed_prompt"], tenant.recomputed_prompt_tokens_total
            )
            limit.add_metric([pool, name], admission.limit_slots)
            target.add_metric([pool, name], tenant.target_slots)
            in_flight.add_metric([pool, name], admission.in_flight_requests)
            queued.add_metric([pool, name], admission.queued_requests)
            slots_in_flight.add_metric([pool, name], admission.in_flight)
            slots_queued.add_metric([pool, name], admission.queued)
            admitted.add_metric([pool, name], admission.admitted_total)
            completed.add_metric([pool, name], admission.completed_total)
            abandoned.add_metric([pool, name], admission.abandoned_total)
            by_reason = admission.rejected_by_reason
            for reason in REJECTION_REASONS:
                rejected.add_metric([pool, name, reason], by_reason[reason])
        version = GaugeMetricFamily(
            "slotshift_gateway_allocation_version",
            "Allocation version enforced (0: the static fallback split).",
            labels=["pool"],
        )
        version.add_metric([pool], self._state.applied_version)
        connected = GaugeMetricFamily(
            "slotshift_gateway_controlplane_connected",
            "1 while the stream to the control plane is up.",
            labels=["pool"],
        )
        connected.add_metric([pool], 1 if self._state.controlplane_connected else 0)
        fallbacks = CounterMetricFamily(
            "slotshift_gateway_prompt_estimate_fallbacks",
            "Requests of a pool weighing prompts by the engine's /tokenize that were weighed by "
            "their length instead: the engine gave no count.",
            labels=["pool"],
        )
        fallbacks.add_metric([pool], self._state.prompt_estimate_fallbacks_total)
        yield from (
            tokens,
            paused,
            pauses,
            moved,
            output_tokens,
            waste,
            limit,
            target,
            in_flight,
            queued,
            slots_in_flight,
            slots_queued,
            admitted,
            completed,
            rejected,
            abandoned,
            version,
            connected,
            fallbacks,
        )
