"""The control plane's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.core.reload import RELOAD_RESULTS, ReloadResult
from controlplane.core.reserves import reserves_in_force
from controlplane.core.stream_identity import RejectionCode, StreamRole
from controlplane.decision_log import DecisionRecord
from controlplane.pool_state import PoolState
from slotshift.apportion import nominal_shares


class ControlPlaneMetrics:
    """Counters and histograms updated as things happen; gauges read from the pools at scrape."""

    def __init__(self, pools: Mapping[str, PoolState]) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "slotshift_controlplane_decisions_total",
            "Allocation decisions, by outcome (published, held, rejected).",
            ["pool", "policy", "outcome"],
            registry=self.registry,
        )
        self.decision_duration = Histogram(
            "slotshift_controlplane_decision_duration_seconds",
            "Time one decision took (gather, compute, validate, publish).",
            ["pool"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )
        self.push_latency = Histogram(
            "slotshift_controlplane_push_latency_seconds",
            "Time from publishing an allocation version to a gateway's acknowledgement of it.",
            ["pool"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.policy_fallbacks = Counter(
            "slotshift_controlplane_policy_fallbacks_total",
            "Decisions where the policy fell back from its primary source (the agent's answer), "
            "by kind (late, failed, unparseable, invalid, ...).",
            ["pool", "policy", "kind"],
            registry=self.registry,
        )
        self.telemetry_reports = Counter(
            "slotshift_controlplane_telemetry_reports_total",
            "Telemetry reports received from agents.",
            ["pool"],
            registry=self.registry,
        )
        self.stream_rejections = Counter(
            "slotshift_controlplane_stream_rejections_total",
            "Gateway and telemetry streams refused at their start, by role (gateway, agent) and "
            "status code (UNAUTHENTICATED: no or wrong credentials; PERMISSION_DENIED: the other "
            "role's, or a pool the peer may not serve).",
            ["role", "code"],
            registry=self.registry,
        )
        # Every series from zero: a first refusal is then an increase, not a new series.
        for role in StreamRole:
            for code in RejectionCode:
                self.stream_rejections.labels(role=role.value, code=code.value)
        self.config_reloads = Counter(
            "slotshift_controlplane_config_reloads_total",
            "Reloads of the config file (SIGHUP, or a change the watch saw), by result: applied, "
            "unchanged, invalid and needs_restart (refused: the running config kept), "
            "store_error (the state store failed part-way).",
            ["result"],
            registry=self.registry,
        )
        for result in RELOAD_RESULTS:
            self.config_reloads.labels(result=result)
        self.registry.register(_PoolStateCollector(pools))
        self._push_latency_of: dict[str, Histogram] = {}
        """pool -> its child of `push_latency`: an acknowledgement comes with every update, and
        a label lookup costs more than the observation."""

    def observe_decision(self, record: DecisionRecord) -> None:
        if record.fallback is not None:
            # "late: no answer within 500 ms" -> "late": a bounded label set.
            kind = record.fallback.split(":", 1)[0].split(" ", 1)[0]
            self.policy_fallbacks.labels(record.pool, record.policy, kind).inc()
        self.decisions.labels(record.pool, record.policy, record.outcome.value).inc()
        self.decision_duration.labels(record.pool).observe(record.duration_ms / 1000)

    def observe_ack(self, pool: str, latency_s: float) -> None:
        """One gateway acknowledged a version of `pool` `latency_s` after it was published."""
        child = self._push_latency_of.get(pool)
        if child is None:
            child = self._push_latency_of[pool] = self.push_latency.labels(pool)
        child.observe(latency_s)

    def observe_stream_rejection(self, role: StreamRole, code: RejectionCode) -> None:
        """Count one refused stream."""
        self.stream_rejections.labels(role=role.value, code=code.value).inc()

    def observe_config_reload(self, result: ReloadResult) -> None:
        """Count one reload of the config file by its result."""
        self.config_reloads.labels(result=result).inc()

    def observe_telemetry(self, pool: str) -> None:
        self.telemetry_reports.labels(pool).inc()


class _PoolStateCollector(Collector):
    """Gauges that are facts about the pools' state, read when Prometheus scrapes."""

    def __init__(self, pools: Mapping[str, PoolState]) -> None:
        self._pools = pools

    def collect(self) -> Iterator[GaugeMetricFamily]:
        budget = GaugeMetricFamily(
            "slotshift_controlplane_budget_slots", "The pool's slot budget.", labels=["pool"]
        )
        version = GaugeMetricFamily(
            "slotshift_controlplane_allocation_version",
            "The pool's current allocation version.",
            labels=["pool"],
        )
        gateways = GaugeMetricFamily(
            "slotshift_controlplane_gateways_connected",
            "Gateways with an open stream to the control plane.",
            labels=["pool"],
        )
        telemetry_age = GaugeMetricFamily(
            "slotshift_controlplane_telemetry_age_seconds",
            "Seconds since the pool's last telemetry report (absent before the first).",
            labels=["pool"],
        )
        limit = GaugeMetricFamily(
            "slotshift_controlplane_tenant_limit_slots",
            "The tenant's current pool-wide limit.",
            labels=["pool", "tenant"],
        )
        nominal = GaugeMetricFamily(
            "slotshift_controlplane_tenant_nominal_slots",
            "The tenant's nominal share of the budget (by weight).",
            labels=["pool", "tenant"],
        )
        reserve = GaugeMetricFamily(
            "slotshift_controlplane_tenant_reserve_slots",
            "The tenant's reserve: the part of its nominal share lent only to preemptible "
            "tenants (learned by the slo policy, or set by lendable_percent), as the last "
            "decision held it.",
            labels=["pool", "tenant"],
        )
        demand = GaugeMetricFamily(
            "slotshift_controlplane_tenant_demand_slots",
            "The tenant's demand (in flight plus queued) summed over the gateways.",
            labels=["pool", "tenant"],
        )
        in_flight = GaugeMetricFamily(
            "slotshift_controlplane_requests_in_flight",
            "The tenant's requests admitted and not finished, summed over the gateways' reports.",
            labels=["pool", "tenant"],
        )
        queued = GaugeMetricFamily(
            "slotshift_controlplane_requests_queued",
            "The tenant's requests waiting for a slot, summed over the gateways' reports.",
            labels=["pool", "tenant"],
        )
        for name, state in self._pools.items():
            budget.add_metric([name], state.pool.budget_slots)
            version.add_metric([name], state.allocation.version)
            gateways.add_metric([name], state.gateways_connected)
            age = state.telemetry_age_s()
            if age is not None:
                telemetry_age.add_metric([name], age)
            shares = nominal_shares(state.pool)
            # The reserves live in the policy state the last decision left: a gauge read from it
            # moves exactly when a decision changed a reserve.
            reserves = reserves_in_force(state.pool, state.policy_state)
            loads = state.snapshot().tenants
            for tenant in state.pool.tenants:
                limit.add_metric([name, tenant.name], state.allocation.tenant_limits[tenant.name])
                nominal.add_metric([name, tenant.name], shares[tenant.name])
                reserve.add_metric([name, tenant.name], reserves[tenant.name])
                load = loads[tenant.name]
                demand.add_metric([name, tenant.name], load.demand_slots)
                in_flight.add_metric([name, tenant.name], load.in_flight)
                queued.add_metric([name, tenant.name], load.queued)
        yield from (
            budget,
            version,
            gateways,
            telemetry_age,
            limit,
            nominal,
            reserve,
            demand,
            in_flight,
            queued,
        )
