"""One admission gateway in the twin: the production GatewayState and control session, and a
request handler in place of the HTTP proxy.

What the gateway enforces and reports is the production code's: GatewayState (its tenants'
TenantAdmission with the FIFO queue, queue timeouts and pauses; apply_allocation; the demand
figures and latency windows it reports) and the control client's ControlSession
(admission_gateway/control_session.py: the hello, the reports and their deltas, each update
applied and acknowledged), which runs on an in-memory stream (stream.py) instead of a gRPC call.
The twin replaces only the transports: a request is a call, not an HTTP exchange. The handler
does what the proxy and the preemptible relay do with a
completion: admit, run it in the engine, record TTFT at its first token (a streamed answer's
only: the proxy sees no first token of a whole answer, nor does its client) and the end-to-end
latency at its last, release; a preemptible tenant's request that is asked to pause leaves the
engine at once, gives its slot back and continues on a new one with its prompt plus what it has
generated (the prefix cache makes the re-prefill cheap), as docs/preemption.md describes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from admission_gateway.admission import AdmissionRejected, QueueFull, Slot
from admission_gateway.control_session import ControlSession, ControlStream
from admission_gateway.gateway_state import GatewayState, TenantState
from engine_sim.engine_core import FinishedRequest, FinishReason, RequestSpec
from engine_sim.tokens import reference_output_ids
from slotshift.clock import Clock
from slotshift.config import GatewayConfig, PoolConfig
from slotshift_tools.bench.arrivals import RequestShape
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from slotshift_tools.twin.engine import TwinEngine


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
        "streamed",
        "tenant",
        "trace",
    )

    def __init__(
        self,
        trace: RequestTrace,
        tenant: TenantState,
        origin_s: float,
        arrived_s: float,
        *,
        streamed: bool,
    ) -> None:
        self.trace = trace
        self.streamed = streamed
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
        if not self.streamed:
            self.last_token_s = times_s[-1]
            self.received += len(times_s)
            return
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

    def token(self, time_s: float) -> None:
        if not self.streamed:
            self.last_token_s = time_s
            self.received += 1
            return
        last_s = self.last_token_s
        if last_s is None:
            self.trace.first_token_s = time_s - self.origin_s
            self.tenant.ttft.observe(time_s - self.arrived_s)
        else:
            self.trace.itl_s.append(time_s - last_s)
        self.last_token_s = time_s
        self.received += 1

    def finished(self, request: FinishedRequest) -> None:
        self.ended = request
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


class RequestServer(Protocol):
    """What the twin's client sends a request to: one gateway (TwinGateway), or one gateway
    fronting a fleet's pools (fleet.TwinFleetGateway)."""

    async def serve(self, trace: RequestTrace, tenant_name: str, shape: RequestShape) -> None:
        """Serve one streamed completion of stack tenant `tenant_name` to its end, filling
        `trace`; only CancelledError escapes."""
        ...


class TwinGateway:
    """One gateway replica: production state and control session, the twin's transports."""

    def __init__(
        self,
        gateway_id: str,
        pool: PoolConfig,
        config: GatewayConfig,
        *,
        clock: Clock,
        engine: TwinEngine,
        origin_s: float,
    ) -> None:
        self.gateway_id = gateway_id
        self.state = GatewayState(pool, config, clock)
        self.session = ControlSession(
            self.state,
            gateway_id=gateway_id,
            report_interval_s=config.report_interval_s,
            queue_report_min_interval_s=config.queue_report_min_interval_s,
            full_report_interval_s=config.full_report_interval_s,
            clock=clock,
        )
        """The control stream's session, with the gateway's knobs as the gateway passes them
        to its ControlClient (admission_gateway/gateway.py)."""
        self._clock = clock
        self._engine = engine
        self._origin_s = origin_s
        self._attempts = 0
        self.refused = 0

    async def control_stream(self, stream: ControlStream) -> None:
        """Run the control session on `stream` until cancelled (the stream never ends here)."""
        await self.session.run(stream, self._opened)

    def _opened(self) -> None:
        # What ControlClient does when its stream opens (StreamState.CONNECTED).
        self.state.controlplane_connected = True

    async def serve(self, trace: RequestTrace, tenant_name: str, shape: RequestShape) -> None:
        """Serve one completion of `tenant_name` to its end (streamed or not, as `shape` asks),
        filling `trace` as the bench's client would; CancelledError (the load's horizon) leaves the request running
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
        stream = _Stream(trace, tenant, self._origin_s, arrived_s, streamed=shape.streamed)
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
