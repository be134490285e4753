"""The OpenAI-compatible reverse proxy's handlers: authenticate, admit within the tenant's
limit, forward.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (streamed or not) take a slot of
the caller's tenant for as long as the engine works on them; `GET /v1/models` needs a key but no
slot. Everything goes to the pool's engine through the EngineRelay (relay.py), which relays the
answer and says how the engine's failures reach the client.

Errors the gateway answers itself are OpenAI-style JSON bodies (see errors.py):
- 401 missing, malformed or unknown API key;
- 400 a body that is not a JSON object; 413 a body over max_body_bytes;
- 429 with Retry-After: the tenant's queue at this gateway is full;
- 503 with Retry-After: no slot within queue_timeout_s (the request waited its turn and the
  tenant's limit stayed full), or the gateway is shutting down;
- 502, 504 and the engine's own statuses: see relay.py.

If the client goes away, the server cancels the handler (handler_cancellation), which aborts the
upstream request and releases the slot.

A preemptible tenant's request of a resumable shape (admission_gateway/resume.py) is admitted as
pausable and relayed by admission_gateway/preemptible.py instead: streamed upstream with token
ids, paused when the control plane takes the tenant's borrowed slots back, and resumed as a
continuation of the same answer (docs/preemption.md).

Each figure of a request (queue wait, time to first token, end-to-end latency) is recorded once,
on its RequestObservation (figures.py), which feeds the reported windows, the metrics and, when
`gateway.request_log` is set, the request's line in the request log, written as it ends.

Traces (see docs/operations.md): each /v1 request is a server span named after its route,
continuing the client's W3C trace context if it sent one, with the tenant, the pool, the gateway,
the allocation version and the outcome as attributes (never the API key); its queue wait is a
child span ("queue wait"), its call to the engine a client span ("upstream POST /v1/...", see
relay.py). An admitted request's span links to the decision whose allocation admitted it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from opentelemetry import trace

from admission_gateway.admission import AdmissionClosed, QueueFull, QueueTimeout, Slot
from admission_gateway.auth import AuthenticationError, Authenticator
from admission_gateway.errors import OpenAIError
from admission_gateway.figures import RequestFigures, RequestObservation
from admission_gateway.gateway_state import GatewayState, TenantState
from admission_gateway.metrics import GatewayMetrics
from admission_gateway.preemptible import PreemptibleRelay
from admission_gateway.relay import (
    NOT_FORWARDED_UPSTREAM,
    EngineRelay,
    forwardable,
    record_status,
    request_id,
)
from admission_gateway.resume import not_resumable
from admission_gateway.upstream import EngineClient
from slotshift.clock import Clock
from slotshift.trace_context import parent_from

_Handler = Callable[[web.Request, str, trace.Span], Awaitable[web.StreamResponse]]


class OpenAIProxy:
    """The /v1 handlers of one gateway."""

    def __init__(
        self,
        *,
        state: GatewayState,
        authenticator: Authenticator,
        engine: EngineClient,
        engine_url: str,
        upstream_timeout_s: float,
        max_body_bytes: int,
        retry_after_s: int,
        metrics: GatewayMetrics,
        clock: Clock,
        tracer: trace.Tracer | None = None,
        gateway_id: str = "",
        paused_keepalive_interval_s: float = 5.0,
        preemption_enabled: bool = True,
    ) -> None:
        self._state = state
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        self._retry_after = {"Retry-After": str(retry_after_s)}
        self.figures = RequestFigures(metrics, clock)
        """Where every request's figures go (the gateway points it at the request log)."""
        self._relay = EngineRelay(
            engine=engine,
            engine_url=engine_url,
            upstream_timeout_s=upstream_timeout_s,
            retry_after=self._retry_after,
            tracer=self._tracer,
        )
        self._preemptible = (
            PreemptibleRelay(
                engine=engine,
                engine_url=engine_url,
                upstream_timeout_s=upstream_timeout_s,
                paused_keepalive_interval_s=paused_keepalive_interval_s,
                tracer=self._tracer,
            )
            if preemption_enabled
            else None
        )
        """Serves preemptible tenants' resumable requests; None when preemption is off."""
        self.gateway_id = gateway_id
        """This gateway's id, on every request's span (set by the gateway once it is bound)."""
        self._authenticator = authenticator
        self._max_body_bytes = max_body_bytes
        self._clock = clock
        self.accepting = True
        """False once the gateway drains: new requests get 503."""

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
        ]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._traced(request, "/v1/completions", self._generate)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._traced(request, "/v1/chat/completions", self._generate)

    async def models(self, request: web.Request) -> web.StreamResponse:
        return await self._traced(request, "/v1/models", self._models)

    async def _models(
        self, request: web.Request, path: str, span: trace.Span
    ) -> web.StreamResponse:
        span.set_attribute("slotshift.tenant", self._tenant_of(request))
        self._refuse_if_draining()
        return await self._relay.forward(request, path, None, observed=None)

    async def _traced(
        self, request: web.Request, path: str, handler: _Handler
    ) -> web.StreamResponse:
        """Run `handler` in the request's server span, and record how the request ended."""
        with self._tracer.start_as_current_span(
            f"{request.method} {path}",
            context=parent_from(request.headers),
            kind=trace.SpanKind.SERVER,
            attributes={
                "http.request.method": request.method,
                "http.route": path,
                "slotshift.pool": self._state.pool_name,
                "slotshift.gateway.id": self.gateway_id,
            },
            # 4xx answers are the client's errors, not the span's; set by hand below.
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await handler(request, path, span)
            except OpenAIError as error:
                record_status(span, error.status, error.code or error.error_type)
                raise
            except web.HTTPException as exc:
                record_status(span, exc.status, None)
                raise
            except asyncio.CancelledError:
                span.set_attribute("error.type", "client_disconnected")
                raise
            except Exception as exc:
                span.record_exception(exc)
                record_status(span, 500, type(exc).__name__)
                raise
            record_status(span, response.status, None)
            return response

    async def _generate(
        self, request: web.Request, path: str, span: trace.Span
    ) -> web.StreamResponse:
        arrived = self._clock.monotonic()
        tenant = self._state.tenants[self._tenant_of(request)]
        span.set_attribute("slotshift.tenant", tenant.name)
        observed = self.figures.begin(tenant, arrived, route=path, headers=request.headers)
        try:
            response = await self._serve(request, path, span, observed)
        except BaseException as exc:
            observed.failed(exc)
            raise
        observed.responded(response.status)
        return response

    async def _serve(
        self, request: web.Request, path: str, span: trace.Span, observed: RequestObservation
    ) -> web.StreamResponse:
        tenant = observed.tenant
        self._refuse_if_draining()
        body = await self._read_body(request)
        document = _require_json_object(body)
        observed.asked(document)
        if tenant.preemptible and self._preemptible is not None:
            why_not = not_resumable(path, document)
            span.set_attribute("slotshift.resumable", why_not is None)
            if why_not is None:
                return await self._serve_resumable(request, path, document, span, observed)
        async with await self._admit(tenant, span, observed):
            return await self._relay.forward(request, path, body, observed=observed)

    async def _serve_resumable(
        self,
        request: web.Request,
        path: str,
        document: dict[str, Any],
        span: trace.Span,
        observed: RequestObservation,
    ) -> web.StreamResponse:
        """A preemptible tenant's resumable request: admitted as pausable and relayed across
        pauses (admission_gateway/preemptible.py)."""
        assert self._preemptible is not None
        rid = request_id(request)
        headers = forwardable(request.headers, NOT_FORWARDED_UPSTREAM)
        headers["X-Request-Id"] = rid
        document = await self._preemptible.with_prompt_ids(path, document, headers)
        tenant = observed.tenant
        slot = await self._admit(tenant, span, observed, pausable=True)
        response_headers: CIMultiDict[str] = CIMultiDict({"X-Request-Id": rid})
        return await self._preemptible.serve(
            request,
            path=path,
            document=document,
            headers=headers,
            response_headers=response_headers,
            tenant=tenant,
            slot=slot,
            observed=observed,
        )

    def _tenant_of(self, request: web.Request) -> str:
        try:
            return self._authenticator.tenant_for(request.headers.get("Authorization"))
        except AuthenticationError as exc:
            raise OpenAIError(
                401, str(exc), error_type="invalid_request_error", code=exc.code
            ) from None

    def _refuse_if_draining(self) -> None:
        if not self.accepting:
            raise self._shutting_down()

    def _shutting_down(self) -> OpenAIError:
        return OpenAIError(
            503,
            "The gateway is shutting down; retry on another replica.",
            error_type="service_unavailable_error",
            code="shutting_down",
            headers=self._retry_after,
        )

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self._max_body_bytes
        too_large = OpenAIError(
            413,
            f"Request body is larger than {limit} bytes.",
            error_type="invalid_request_error",
            code="request_too_large",
        )
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    async def _admit(
        self,
        tenant: TenantState,
        span: trace.Span,
        observed: RequestObservation,
        *,
        pausable: bool = False,
    ) -> Slot:
        """A slot for the request, waited for in a "queue wait" span; the request's span says
        whether and under which allocation it was admitted, and links to that allocation's
        decision."""
        admission = tenant.admission
        with self._tracer.start_as_current_span(
            "queue wait",
            attributes={
                "slotshift.tenant": tenant.name,
                "slotshift.tenant.limit_slots": admission.limit_slots,
                "slotshift.tenant.in_flight": admission.in_flight,
                "slotshift.tenant.queued": admission.queued,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as waiting:
            try:
                slot = await self._acquire(tenant, pausable=pausable)
                observed.admitted(slot)
            except OpenAIError as error:
                rejected: dict[str, str | int] = {
                    "slotshift.admission.outcome": "rejected",
                    "slotshift.admission.rejection_reason": error.code or error.error_type,
                    "slotshift.allocation.version": self._state.applied_version,
                }
                waiting.set_attributes(rejected)
                waiting.set_status(trace.StatusCode.ERROR, error.code)
                span.set_attributes(rejected)
                raise
        span.set_attributes(
            {
                "slotshift.admission.outcome": "admitted",
                "slotshift.allocation.version": self._state.applied_version,
                "slotshift.queue.wait_s": slot.queue_wait_s,
            }
        )
        if tenant.decision is not None:
            span.add_link(
                tenant.decision,
                {
                    "slotshift.link": "admitted under this decision's allocation",
                    "slotshift.allocation.version": self._state.applied_version,
                },
            )
        return slot

    async def _acquire(self, tenant: TenantState, *, pausable: bool) -> Slot:
        try:
            slot = await tenant.admission.acquire(pausable=pausable)
        except QueueFull:
            raise OpenAIError(
                429,
                f"Too many requests queued for tenant {tenant.name}; retry later.",
                error_type="rate_limit_error",
                code="queue_full",
                headers=self._retry_after,
            ) from None
        except QueueTimeout:
            raise OpenAIError(
                503,
                f"No slot became free for tenant {tenant.name} in time; retry later.",
                error_type="service_unavailable_error",
                code="queue_timeout",
                headers=self._retry_after,
            ) from None
        except AdmissionClosed:
            raise self._shutting_down() from None
        return slot


def _require_json_object(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        raise OpenAIError(
            400,
            "The request body is not valid JSON.",
            error_type="invalid_request_error",
            code="invalid_json",
        ) from None
    if not isinstance(document, dict):
        raise OpenAIError(
            400,
            "The request body must be a JSON object.",
            error_type="invalid_request_error",
            code="invalid_json",
        )
    return document
