"""Samples, every interval, what the study plots: allocation, demand and the GPU.

From the control plane (AllocationService): each tenant's decided limit (GetAllocation), what it
runs and queues over the gateways (ListTenants: the demand the policy sees) and the decision log
(GetDecisions, merged by id so a long run never loses one to the log's bound). From the engine's
/metrics: running and waiting requests, KV-cache usage and, on the emulator, its modelled GPU
utilisation (`slotshift_sim_gpu_utilization_percent`, labelled emulated), and the counters
the waste is computed from (generated tokens, prefix-cache queries and hits). When the engine
has no such gauge, the GPU figure is the one the telemetry agent last reported into a decision
(NVML on a real GPU; its own emulated flag says which). From each gateway's /metrics: its waste
counter per tenant and kind, summed over the gateways (slotshift_tools/bench/waste.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families

from slotshift.clock import Clock
from slotshift.v1 import query_pb2, query_pb2_grpc
from slotshift.wire import from_timestamp
from slotshift_tools.bench.decisions import HELD, PUBLISHED, REJECTED, DecisionView, merge
from slotshift_tools.bench.load import TenantCounters
from slotshift_tools.metrics_scrape import Samples, scrape_samples, summed

logger = logging.getLogger(__name__)

SIM_GPU_UTILIZATION = "slotshift_sim_gpu_utilization_percent"
GATEWAY_WASTE = "slotshift_gateway_waste_tokens"
"""The gateways' waste counter (exposed as `_total`), labelled tenant and kind."""
DECISIONS_PER_POLL = 64
"""Decisions fetched per sample: far more than can be taken between two samples."""

_OUTCOMES = {
    query_pb2.DECISION_OUTCOME_PUBLISHED: PUBLISHED,
    query_pb2.DECISION_OUTCOME_HELD: HELD,
    query_pb2.DECISION_OUTCOME_REJECTED: REJECTED,
}


@dataclass
class Sample:
    """One instant of a run."""

    t_s: float
    """Seconds from the start of the load."""
    wall_s: float
    version: int | None = None
    """Allocation version; None when the control plane did not answer."""
    limits: dict[str, int] = field(default_factory=dict)
    """Each control-plane tenant's decided pool-wide limit."""
    granted: dict[str, int] = field(default_factory=dict)
    """What the gateways may admit now, summed (below the limit while lent slots drain)."""
    in_flight: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    outstanding: dict[str, int] = field(default_factory=dict)
    """Each scenario tenant's requests sent and not ended (client-side demand)."""
    completed: dict[str, int] = field(default_factory=dict)
    """Each scenario tenant's requests completed so far (warm-up included)."""
    engine_running: float | None = None
    engine_waiting: float | None = None
    kv_cache_usage: float | None = None
    """0 to 1."""
    engine_generation_tokens: float | None = None
    """The engine's vllm:generation_tokens_total (output tokens generated since it started)."""
    engine_prefix_cache_queries: float | None = None
    """The engine's vllm:prefix_cache_queries_total (prompt tokens looked up in its cache)."""
    engine_prefix_cache_hits: float | None = None
    """The engine's vllm:prefix_cache_hits_total (of those, tokens found there)."""
    engine_read_s: float | None = None
    """When the engine's counters were read (the middle of the scrape), like t_s; None: not
    read. Later than t_s by the control plane's answers, which matters to a counter's rate."""
    gateway_waste_tokens: dict[str, dict[str, float]] | None = None
    """The gateways' waste counters summed: tenant -> kind -> tokens; None when a gateway did
    not answer or does not export the counter."""
    gateway_read_s: float | None = None
    """When the gateways' counters were read (the middle of their scrapes), like t_s."""
    gpu_utilization_pct: float | None = None
    gpu_emulated: bool | None = None

    @property
    def demand(self) -> dict[str, int]:
        """Each control-plane tenant's demand as the policy sees it: running plus queued."""
        return {t: self.in_flight.get(t, 0) + self.queued.get(t, 0) for t in self.in_flight}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def decision_view(decision: query_pb2.Decision) -> DecisionView:
    """What the harness keeps of a decision."""
    return DecisionView(
        id=decision.id,
        decided_at_wall_s=from_timestamp(decision.decided_at),
        outcome=_OUTCOMES.get(decision.outcome, "unspecified"),
        outputs={o.tenant: o.limit_slots for o in decision.outputs},
        reason=decision.reason,
    )


class Sampler:
    """Takes a Sample every interval while it runs; keeps every decision it has seen."""

    def __init__(
        self,
        *,
        stub: query_pb2_grpc.AllocationServiceAsyncStub,
        session: aiohttp.ClientSession,
        pool: str,
        engine_metrics_url: str,
        counters: Mapping[str, TenantCounters],
        clock: Clock,
        origin_s: float,
        interval_s: float,
        gateway_metrics_urls: Sequence[str] = (),
        rpc_timeout_s: float = 2.0,
    ) -> None:
        """gateway_metrics_urls: each gateway's /metrics, read for its waste counters (none:
        no per-tenant waste)."""
        self._stub = stub
        self._session = session
        self._pool = pool
        self._metrics_url = engine_metrics_url
        self._counters = counters
        self._clock = clock
        self._origin_s = origin_s
        self._interval_s = interval_s
        self._gateway_metrics_urls = list(gateway_metrics_urls)
        self._rpc_timeout_s = rpc_timeout_s
        self.samples: list[Sample] = []
        self.decisions: dict[int, DecisionView] = {}
        self._latest_decision: query_pb2.Decision | None = None

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    async def run(self) -> None:
        """Sample every interval until cancelled, on a fixed grid (a slow sample does not
        shift the next ones)."""
        next_s = self._now_s()
        while True:
            self.samples.append(await self.sample())
            next_s += self._interval_s
            await asyncio.sleep(max(0.0, next_s - self._now_s()))

    async def sample(self) -> Sample:
        """One sample now."""
        sample = Sample(t_s=self._now_s(), wall_s=self._clock.wall())
        sample.outstanding = {t: c.outstanding for t, c in self._counters.items()}
        sample.completed = {t: c.completed for t, c in self._counters.items()}
        await self._read_control_plane(sample)
        await self._read_engine(sample)
        await self._read_gateways(sample)
        return sample

    async def fetch_decisions(self) -> None:
        """Merge the newest decisions into `decisions`."""
        reply = await self._stub.GetDecisions(
            query_pb2.GetDecisionsRequest(pool=self._pool, limit=DECISIONS_PER_POLL),
            timeout=self._rpc_timeout_s,
        )
        merge(self.decisions, (decision_view(d) for d in reply.decisions))
        if reply.decisions:
            self._latest_decision = reply.decisions[0]

    async def _read_control_plane(self, sample: Sample) -> None:
        try:
            allocation = await self._stub.GetAllocation(
                query_pb2.GetAllocationRequest(pool=self._pool), timeout=self._rpc_timeout_s
            )
            tenants = await self._stub.ListTenants(
                query_pb2.ListTenantsRequest(pool=self._pool), timeout=self._rpc_timeout_s
            )
            await self.fetch_decisions()
        except grpc.aio.AioRpcError as exc:
            # One missed sample is a gap in a plot; the stack watcher stops the run if the
            # control plane is really gone.
            logger.warning("control plane did not answer a sample: %s", exc.code())
            return
        sample.version = allocation.version
        sample.limits = {a.tenant: a.limit_slots for a in allocation.tenants}
        granted: dict[str, int] = dict.fromkeys(sample.limits, 0)
        for gateway in allocation.gateways:
            for limit in gateway.tenants:
                granted[limit.tenant] = granted.get(limit.tenant, 0) + limit.limit_slots
        sample.granted = granted
        sample.in_flight = {i.allocation.tenant: i.in_flight for i in tenants.tenants}
        sample.queued = {i.allocation.tenant: i.queued for i in tenants.tenants}

    async def _read_engine(self, sample: Sample) -> None:
        before_s = self._now_s()
        gauges = await self._engine_gauges()
        if gauges:
            sample.engine_read_s = (before_s + self._now_s()) / 2
        sample.engine_running = summed(gauges, "vllm:num_requests_running")
        sample.engine_waiting = summed(gauges, "vllm:num_requests_waiting")
        sample.kv_cache_usage = summed(gauges, "vllm:kv_cache_usage_perc")
        sample.engine_generation_tokens = summed(gauges, "vllm:generation_tokens_total")
        sample.engine_prefix_cache_queries = summed(gauges, "vllm:prefix_cache_queries_total")
        sample.engine_prefix_cache_hits = summed(gauges, "vllm:prefix_cache_hits_total")
        emulated = summed(gauges, SIM_GPU_UTILIZATION)
        if emulated is not None:
            sample.gpu_utilization_pct = emulated
            sample.gpu_emulated = True
            return
        telemetry = self._latest_decision.telemetry if self._latest_decision else None
        if telemetry is not None and telemetry.gpu_available:
            sample.gpu_utilization_pct = telemetry.gpu_utilization_pct
            sample.gpu_emulated = telemetry.gpu_emulated

    async def _read_gateways(self, sample: Sample) -> None:
        if not self._gateway_metrics_urls:
            return
        before_s = self._now_s()
        texts = []
        for url in self._gateway_metrics_urls:
            try:
                async with self._session.get(
                    url, timeout=aiohttp.ClientTimeout(total=self._rpc_timeout_s)
                ) as response:
                    response.raise_for_status()
                    texts.append(await response.text())
            except (aiohttp.ClientError, TimeoutError) as exc:
                # A sum over some of the gateways would read as a drop in their counters.
                logger.warning("gateway %s did not answer a sample: %s", url, exc)
                return
        sample.gateway_waste_tokens = gateway_waste(texts)
        sample.gateway_read_s = (before_s + self._now_s()) / 2

    async def _engine_gauges(self) -> Samples:
        """The engine's samples; none when it does not answer."""
        try:
            return await scrape_samples(
                self._session, self._metrics_url, timeout_s=self._rpc_timeout_s
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("engine /metrics did not answer a sample: %s", exc)
            return {}

    def _now_s(self) -> float:
        return self._clock.monotonic() - self._origin_s


def gateway_waste(expositions: Sequence[str]) -> dict[str, dict[str, float]] | None:
    """The waste counters of every gateway's /metrics text, summed: tenant -> kind -> tokens.
    None when one of them does not declare the counter; a declared counter with no samples yet
    (a labelled counter shows a label set once counted) is no waste yet."""
    total: dict[str, dict[str, float]] = {}
    for text in expositions:
        declared = False
        for family in text_string_to_metric_families(text):
            declared = declared or family.name == GATEWAY_WASTE
            # By sample name, not family: a `_created` line between two label sets makes the
            # text parser start untyped families that still hold `_total` samples.
            for point in family.samples:
                if point.name != f"{GATEWAY_WASTE}_total":
                    continue
                declared = True
                by_kind = total.setdefault(point.labels.get("tenant", ""), {})
                kind = point.labels.get("kind", "")
                by_kind[kind] = by_kind.get(kind, 0.0) + point.value
        if not declared:
            return None
    return total
