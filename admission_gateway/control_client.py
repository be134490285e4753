"""The gateway's end of `GatewayService.Connect`: limits come in, demand and acks go out.

Protocol (proto/slotshift/v1/gateway.proto):
- on every (re)connection the first message is a GatewayHello with the version in force (0 on the
  fallback split) and each tenant's limit and usage, so that a restarted control plane rebuilds
  its view of the pool before it grants anything;
- then a DemandReport every report_interval_s;
- on an AllocationUpdate newer than the applied version, every tenant is resized first and the
  AllocationAck (version and usage at that moment) is sent right after. The control plane counts
  on "once acked, this gateway admits at most limit_slots" to keep the pool within its budget, so
  the ack never precedes the resize. Updates not newer than the applied version are ignored.
- every message with figures (hello, report, ack) says when they were taken (`observed_at`, the
  gateway's wall clock), so that the control plane never lets older figures replace newer ones,
  and each report names the version in force, which heals an ack that was lost.

While the stream is down the gateway keeps enforcing the last applied limits (fail-static; with
`on_controlplane_loss: fallback`, at most the fallback split) and reconnects with exponential
backoff and jitter (slotshift.reconnect).

The session itself (what is said and done on one open stream) is
admission_gateway/control_session.py's ControlSession; this client opens the gRPC calls it runs
on and keeps them up.

Traces: each connection attempt is a "controlplane.connect" span whose context goes in the call's
metadata (the control plane handles the hello under it); each update is applied in an
"allocation.apply" span, the child of the control plane's push (from
`AllocationUpdate.trace_context`). The decision the update comes from is remembered per tenant, for
the requests admitted under it to link to.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Sequence

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from pydantic import SecretStr

from admission_gateway.control_session import ControlSession, TenantsObserver
from admission_gateway.gateway_state import GatewayState
from slotshift.clock import Clock
from slotshift.reconnect import ReconnectingStream, StreamState, Targets
from slotshift.stream_token import bearer_metadata
from slotshift.tls import ChannelSecurity, open_channel
from slotshift.trace_context import carrier_of, grpc_metadata
from slotshift.v1 import gateway_pb2, gateway_pb2_grpc

logger = logging.getLogger(__name__)

_Call = grpc.aio.StreamStreamCall[gateway_pb2.GatewayMessage, gateway_pb2.ControlMessage]


class ControlClient:
    """Keeps one gateway's stream to the control plane up and applies what it pushes.

    The stream is kept up by slotshift.reconnect (a fresh channel per attempt, backoff with
    jitter, reset after a healthy stream, one log line per change of state); this class is the
    session on it and what the gateway does when it comes and goes. `target` is one address, or
    the addresses of the control plane's replicas: the stream goes to the one whose gRPC health
    says it serves GatewayService (the leader), tried in turn (slotshift.reconnect.Targets).
    """

    def __init__(
        self,
        state: GatewayState,
        *,
        target: str | Sequence[str],
        gateway_id: str,
        report_interval_s: float,
        queue_report_min_interval_s: float,
        reconnect_initial_s: float,
        full_report_interval_s: float = 5.0,
        reconnect_max_s: float,
        clock: Clock,
        rng: random.Random | None = None,
        tracer: trace.Tracer | None = None,
        security: ChannelSecurity | None = None,
        token: SecretStr | None = None,
        on_tenants: TenantsObserver | None = None,
    ) -> None:
        """token: presented on every stream (`authorization: Bearer TOKEN`, the gateways'
        stream token); None sends none."""
        self._state = state
        self._auth_metadata = bearer_metadata(token)
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        addresses = (target,) if isinstance(target, str) else tuple(target)
        self._targets = Targets(
            addresses,
            functools.partial(_open, security),
            health_service=gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name,
        )
        self._gateway_id = gateway_id
        self.session = ControlSession(
            state,
            gateway_id=gateway_id,
            report_interval_s=report_interval_s,
            queue_report_min_interval_s=queue_report_min_interval_s,
            full_report_interval_s=full_report_interval_s,
            clock=clock,
            tracer=self._tracer,
            on_tenants=on_tenants,
        )
        """What the gateway says and does on each stream this client opens."""
        self._link = ReconnectingStream(
            self._session,
            open_channel=self._targets,
            stream="control stream",
            peer="the control plane",
            initial_s=reconnect_initial_s,
            max_s=max(reconnect_max_s, reconnect_initial_s),
            clock=clock,
            rng=rng if rng is not None else random.Random(),
            logger=logger,
            on_state=self._on_state,
        )

    @property
    def connected(self) -> bool:
        """Whether the stream to the control plane is open now."""
        return self._state.controlplane_connected

    @property
    def attempts(self) -> int:
        """Connection attempts so far, successful or not."""
        return self._link.attempts

    @property
    def sessions_started(self) -> int:
        """Streams opened so far (a hello was sent on each)."""
        return self._link.sessions_started

    async def run(self) -> None:
        """Connect, and reconnect whenever the stream ends, until cancelled."""
        await self._link.run()

    async def _session(self, channel: grpc.aio.Channel, opened: Callable[[], None]) -> str:
        """One stream, from hello to its end (see slotshift.reconnect.SessionBody): the call on
        `channel`, and the session on it."""
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        connecting = self._tracer.start_span(
            "controlplane.connect",
            # A root: a connection belongs to no request or decision.
            context=Context(),
            kind=trace.SpanKind.CLIENT,
            attributes={
                "slotshift.pool": self._state.pool_name,
                "slotshift.gateway.id": self._gateway_id,
                "slotshift.allocation.applied_version": self._state.applied_version,
                "rpc.system": "grpc",
                "rpc.method": "slotshift.v1.GatewayService/Connect",
                "server.address": self._targets.current,
            },
        )
        # None: messages are written with call.write, not drawn from an iterator.
        call: _Call = stub.Connect(
            None, metadata=(*grpc_metadata(carrier_of(connecting)), *self._auth_metadata)
        )
        try:
            return await self.session.run(call, opened, connecting=connecting)
        finally:
            call.cancel()

    def _on_state(self, change: StreamState) -> str:
        """Follow the stream's state; what the gateway enforces meanwhile, for the log line."""
        self._state.controlplane_connected = change is StreamState.CONNECTED
        if change is StreamState.CONNECTED:
            return f"gateway {self._gateway_id}, applied version {self._state.applied_version}"
        if change is StreamState.UNREACHABLE:
            return "enforcing the fallback split"
        if change is StreamState.LOST:
            if self._state.controlplane_lost():
                return "cut to at most the fallback split until it is back"
            return f"enforcing allocation {self._state.applied_version} until it is back"
        return ""


def _open(security: ChannelSecurity | None, target: str) -> grpc.aio.Channel:
    return open_channel(target, security)
