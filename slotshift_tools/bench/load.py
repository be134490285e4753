"""The load: every tenant's arrival process, driven against the gateways until the horizon.

The sends come from each tenant's arrival process (slotshift_tools/bench/arrivals.py), or, given
a schedule, from that schedule instead (a recorded request log replayed: slotshift_tools/replay.py):
the same request path either way, only when each request is sent and what it asks for differ.

Requests run as tasks of asyncio TaskGroups scoped to the load, not as background tasks: they
live exactly as long as the load, a bug in one fails the run loudly, and cancelling the load
(at the horizon) cancels every request still running, which its trace records as cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slotshift.config import reveal
from slotshift_tools.bench.arrivals import (
    RequestShape,
    RequestShapes,
    arrival_times,
    concurrency_at,
    is_open_loop,
    max_concurrency,
    next_on_start,
    tenant_rng,
)
from slotshift_tools.bench.scenario import BenchTenant, ClosedLoopArrival, OnOffArrival, Scenario
from slotshift_tools.bench.trace import RequestStatus, RequestTrace


class RequestSender(Protocol):
    """What sends the load's requests: the bench's StreamingClient over HTTP, or the twin's."""

    def now_s(self) -> float:
        """Seconds since the load's origin."""
        ...

    async def send(
        self, trace: RequestTrace, gateway_url: str, api_key: str, shape: RequestShape
    ) -> None:
        """Send one request (trace.start_s is set now) and fill its trace; never raises for a
        failed request, only CancelledError (the trace is then marked cancelled)."""
        ...


class ScheduledRequest(Protocol):
    """One send of a given schedule (`slotshift_tools.replay.ReplayedRequest` is one)."""

    @property
    def send_at_s(self) -> float:
        """When to send it, in seconds from the load's origin."""
        ...

    def shape(self, rng: random.Random) -> RequestShape:
        """What it asks for (streamed or not), any random content drawn from `rng`."""
        ...


@dataclass
class TenantCounters:
    """One tenant's requests so far, for the progress display and the samples."""

    sent: int = 0
    completed: int = 0
    failed: int = 0
    outstanding: int = 0
    """Sent and not yet ended: the tenant's demand as the client sees it."""


class LoadGenerator:
    """Sends the scenario's load through the gateways, round robin per tenant."""

    def __init__(
        self,
        scenario: Scenario,
        client: RequestSender,
        gateway_urls: list[str],
        *,
        horizon_s: float,
        schedule: Mapping[str, Sequence[ScheduledRequest]] | None = None,
    ) -> None:
        """horizon_s: when (from the client's origin) no more requests are sent.

        schedule: when given, every tenant's sends are its entries here, in order and open
        loop, instead of its arrival process (a tenant without entries sends nothing); each
        request's shape is drawn from the tenant's request stream (`tenant_rng(seed, tenant,
        "requests")`), so a schedule gives the same requests on every run. ValueError when it
        names a tenant the scenario does not have, or one tenant's send times decrease."""
        if not gateway_urls:
            raise ValueError("the load needs at least one gateway")
        if schedule is not None:
            names = {t.name for t in scenario.tenants}
            strangers = sorted(set(schedule) - names)
            if strangers:
                raise ValueError(
                    f"the schedule names tenants the scenario does not have: {', '.join(strangers)}"
                )
            for name, sends in schedule.items():
                times = [send.send_at_s for send in sends]
                if any(later < earlier for earlier, later in itertools.pairwise(times)):
                    raise ValueError(f"tenant {name}'s scheduled sends are out of order")
        self._schedule = schedule
        self._scenario = scenario
        self._client = client
        self._gateways = gateway_urls
        self._horizon_s = horizon_s
        self.traces: list[RequestTrace] = []
        """Every request sent, in sending order."""
        self.counters = {t.name: TenantCounters() for t in scenario.tenants}
        self._shapes = {
            t.name: RequestShapes(
                t.prompt_tokens, t.output_tokens, tenant_rng(scenario.seed, t.name, "requests")
            )
            for t in scenario.tenants
        }

    async def run(self) -> None:
        """Run every tenant's process until the horizon and its requests have ended (or until
        cancelled)."""
        async with asyncio.TaskGroup() as tenants:
            for tenant in self._scenario.tenants:
                tenants.create_task(self._drive(tenant), name=f"load/{tenant.name}")

    async def _drive(self, tenant: BenchTenant) -> None:
        if self._schedule is not None:
            shapes_rng = tenant_rng(self._scenario.seed, tenant.name, "requests")
            sends = self._schedule.get(tenant.name, ())
            await self._open_loop(
                tenant, ((send.send_at_s, _shape_of(send, shapes_rng)) for send in sends)
            )
            return
        arrival = tenant.arrival
        if is_open_loop(arrival):
            rng = tenant_rng(self._scenario.seed, tenant.name, "arrivals")
            times = arrival_times(arrival, rng, self._horizon_s)
            draw = self._shapes[tenant.name].next
            await self._open_loop(tenant, ((send_at_s, draw) for send_at_s in times))
            return
        assert isinstance(arrival, ClosedLoopArrival | OnOffArrival)
        async with asyncio.TaskGroup() as clients:
            for index in range(max_concurrency(arrival)):
                clients.create_task(
                    self._closed_loop_client(tenant, arrival, index),
                    name=f"load/{tenant.name}/client-{index}",
                )

    async def _open_loop(
        self, tenant: BenchTenant, sends: Iterable[tuple[float, Callable[[], RequestShape]]]
    ) -> None:
        """Send each request at its time (those at or past the horizon are not sent), without
        waiting for answers; return when every one has ended."""
        async with asyncio.TaskGroup() as requests:
            for index, (send_at_s, shape) in enumerate(sends):
                if send_at_s >= self._horizon_s:
                    break
                await self._sleep_until(send_at_s)
                requests.create_task(
                    self._request(tenant, index % len(self._gateways), shape()),
                    name=f"load/{tenant.name}/{index}",
                )

    async def _closed_loop_client(
        self, tenant: BenchTenant, arrival: ClosedLoopArrival | OnOffArrival, index: int
    ) -> None:
        """Client `index` of a closed-loop process: one request at a time, sent as soon as the
        previous ends, while the process wants more than `index` outstanding."""
        gateway = index % len(self._gateways)
        while (now_s := self._client.now_s()) < self._horizon_s:
            if concurrency_at(arrival, now_s) <= index:
                assert isinstance(arrival, OnOffArrival)  # a plain closed loop never pauses
                await self._sleep_until(min(next_on_start(arrival, now_s), self._horizon_s))
                continue
            trace = await self._request(tenant, gateway, self._shapes[tenant.name].next())
            if trace.status is RequestStatus.FAILED:
                await asyncio.sleep(self._scenario.failure_backoff_s)

    async def _request(
        self, tenant: BenchTenant, gateway: int, shape: RequestShape
    ) -> RequestTrace:
        trace = RequestTrace(
            tenant=tenant.name,
            gateway=gateway,
            prompt_tokens=len(shape.prompt_token_ids),
            max_tokens=shape.max_tokens,
            start_s=self._client.now_s(),
        )
        self.traces.append(trace)
        counters = self.counters[tenant.name]
        counters.sent += 1
        counters.outstanding += 1
        try:
            await self._client.send(
                trace, self._gateways[gateway], reveal(tenant.api_keys[0]), shape
            )
        finally:
            counters.outstanding -= 1
            if trace.status is RequestStatus.OK:
                counters.completed += 1
            elif trace.status is RequestStatus.FAILED:
                counters.failed += 1
        return trace

    async def _sleep_until(self, t_s: float) -> None:
        delay_s = t_s - self._client.now_s()
        if delay_s > 0:
            await asyncio.sleep(delay_s)


def _shape_of(send: ScheduledRequest, rng: random.Random) -> Callable[[], RequestShape]:
    """`send`'s shape, drawn when the request is sent (so in sending order)."""
    return lambda: send.shape(rng)
