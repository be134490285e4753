"""One admission gateway in the twin: the production GatewayState, a request handler in place of
the HTTP proxy, and the control client's reports and acknowledgements.

What the gateway enforces and reports is the production code's: GatewayState (its tenants'
TenantAdmission with the FIFO queue, queue timeouts and pauses; apply_allocation; the demand
figures and latency windows it reports). The twin replaces only the transport: a request is a
call, not an HTTP exchange, and a message to the control plane is a callback after the network's
transit time. The handler does what the proxy and the preemptible relay do with a streamed
completion: admit, run it in the engine, record TTFT at its first token and the end-to-end
latency at its last, release; a preemptible tenant's request that is asked to pause leaves the
engine at once, gives its slot back and continues on a new one with its prompt plus what it has
generated (the prefix cache makes the re-prefill cheap), as docs/preemption.md describes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from admission_gateway.admission import AdmissionRejected, QueueFull, Slot
from admission_gateway.gateway_state import GatewayState, TenantLimit, TenantState
from engine_sim.engine_core import FinishedRequest, FinishReason, RequestSpec
from engine_sim.tokens import reference_output_ids
from slotshift.clock import Clock
from slotshift.config import GatewayConfig, PoolConfig
from slotshift.demand import TenantDemand
from slotshift_tools.bench.arrivals import RequestShape
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from slotshift_tools.twin.engine import TwinEngine

Report = Callable[[str, int, list[TenantDemand], float], None]
"""(gateway id, version, figures, observed at wall s): a report (its applied version) or an ack
(the version applied) on its way to the control plane."""


@dataclass(frozen=True, slots=True)
class PushedRow:
    """One gateway's limits for every tenant, as an allocation update carries them."""

    version: int
    limits: tuple[TenantLimit, ...]


class _Stream:
    """A request as its client sees it, and the engine's TokenListener for its attempts: the
    trace's times (from the load's origin), its TTFT into the tenant's window at the first
    token as the proxy records it, and when the current attempt has left the engine."""

    __slots__ = (
        "arrived_s",
        "done",
        "ended",
        "last_token_s",
        "origin_s",
        "received",
        "tenant",
        "trace",
    )

    def __init__(
        self, trace: RequestTrace, tenant: TenantState, origin_s: float, arrived_s: float
    ) -> None:
        self.trace = trace
        self.tenant = tenant
        self.origin_s = origin_s
        self.arrived_s = arrived_s
        self.received = 0
        self.last_token_s: float | None = None
        self.ended: FinishedRequest | None = None
        self.done: asyncio.Future[None] | None = None

    def start_attempt(self) -> asyncio.Future[None]:
        """A new attempt begins; the future is done when it has left the engine."""
        self.ended = None
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def tokens(self, times_s: Sequence[float], gaps_s: Sequence[float]) -> None:
        itl = self.trace.itl_s
        if self.last_token_s is None:
            self.trace.first_token_s = times_s[0] - self.origin_s
            self.tenant.ttft.observe(times_s[0] - self.arrived_s)
        else:
            itl.append(times_s[0] - self.last_token_s)
        if gaps_s:
            itl.extend(gaps_s)
        self.last_token_s = times_s[-1]
        self.received += len(times_s)

    def finished(self, request: FinishedRequest) -> None:
        self.ended = request
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


class TwinGateway:
    """One gateway replica: production state, the twin's transport."""

    def __init__(
        self,
        gateway_id: str,
        pool: PoolConfig,
        config: GatewayConfig,
        *,
        clock: Clock,
        engine: TwinEngine,
        origin_s: float,
        report: Report,
        ack: Report,
    ) -> None:
        self.gateway_id = gateway_id
        self.state = GatewayState(pool, config, clock)
        self._config = config
        self._clock = clock
        self._engine = engine
        self._origin_s = origin_s
        self._report = report
        self._ack = ack
        self._attempts = 0
        self.refused = 0

    def figures(self) -> list[TenantDemand]:
        """Every tenant's demand now, as the control client reports it."""
        return self.state.demand()

    def apply(self, pushed: PushedRow) -> None:
        """An allocation update arrived: enforce it, and acknowledge it with the figures under
        the new limits (as the control client does, with nothing awaited in between)."""
        if self.state.apply_allocation(pushed.version, pushed.limits):
            self._ack(self.gateway_id, pushed.version, self.figures(), self._clock.wall())

    async def report_periodically(self) -> None:
        """The control client's reports: every report_interval_s, and sooner (at most every
        queue_report_min_interval_s) when a tenant's queue starts, until cancelled."""
        config = self._config
        started = self.state.queue_started
        wait_s = config.report_interval_s - config.queue_report_min_interval_s
        while True:
            await asyncio.sleep(config.queue_report_min_interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(started.wait(), wait_s)
            started.clear()
            self._report(
                self.gateway_id, self.state.applied_version, self.figures(), self._clock.wall()
            )

    async def serve(self, trace: RequestTrace, tenant_name: str, shape: RequestShape) -> None:
        """Serve one streamed completion of `tenant_name` to its end, filling `trace` as the
        bench's client would; CancelledError (the load's horizon) leaves the request running
        nowhere."""
        tenant = self.state.tenants[tenant_name]
        arrived_s = self._clock.monotonic()
        try:
            slot = await tenant.admission.acquire(pausable=tenant.preemptible)
        except AdmissionRejected as exc:
            status = 429 if isinstance(exc, QueueFull) else 503
            self.refused += 1
            trace.fail(self._clock.monotonic() - self._origin_s, f"HTTP {status}: {exc}", status)
            return
        trace.http_status = 200
        stream = _Stream(trace, tenant, self._origin_s, arrived_s)
        prompt = tuple(shape.prompt_token_ids)
        try:
            while True:
                ended = await self._attempt(tenant, slot, stream, prompt, shape.max_tokens)
                if ended.reason is not FinishReason.ABORT:
                    break
                # Paused: out of the engine; wait for a slot again, at the head of the queue.
                slot = await tenant.admission.resume(slot)
        finally:
            slot.release()
        now = self._clock.monotonic()
        tenant.e2e.observe(now - arrived_s)
        trace.status = RequestStatus.OK
        trace.end_s = now - self._origin_s
        trace.output_tokens = stream.received

    async def _attempt(
        self,
        tenant: TenantState,
        slot: Slot,
        stream: _Stream,
        prompt: tuple[int, ...],
        max_tokens: int,
    ) -> FinishedRequest:
        """Run the request in the engine on `slot` from where it stands until it ends or is
        paused (it has then left the engine); how it left."""
        self._attempts += 1
        request_id = f"{self.gateway_id}-{self._attempts}"
        done = stream.received
        if done:
            # A continuation: the prompt plus what was generated, the rest to generate.
            prompt = prompt + tuple(reference_output_ids(prompt, done, ignore_eos=True))
        spec = RequestSpec(request_id, prompt, max_tokens - done, ignore_eos=True)
        left = stream.start_attempt()
        self._engine.submit(spec, stream)
        slot.on_pause(lambda: self._engine.abort(request_id))
        try:
            await left
        except asyncio.CancelledError:
            self._engine.abort(request_id)
            raise
        finally:
            slot.on_pause(None)
        ended = stream.ended
        assert ended is not None
        if tenant.preemptible:
            tenant.output_tokens_total += stream.received - done
            if done and ended.first_scheduled_s is not None:
                # The resumed prompt's tokens the prefix cache did not hold were computed again.
                tenant.recomputed_prompt_tokens_total += max(
                    0, ended.prompt_tokens - ended.cached_tokens
                )
        return ended
