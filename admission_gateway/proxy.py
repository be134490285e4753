"""The OpenAI-compatible reverse proxy: authenticate, admit within the tenant's limit, forward.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (streamed or not) take a slot of
the caller's tenant for as long as the engine works on them; `GET /v1/models` needs a key but no
slot. Everything goes to the pool's engine through one shared EngineClient (upstream.py).

Errors are OpenAI-style JSON bodies (see errors.py):
- 401 missing, malformed or unknown API key;
- 400 a body that is not a JSON object; 413 a body over max_body_bytes;
- 429 with Retry-After: the tenant's queue at this gateway is full;
- 503 with Retry-After: no slot within queue_timeout_s (the request waited its turn and the
  tenant's limit stayed full), or the gateway is shutting down;
- 502 the engine could not be reached or dropped the connection; 504 upstream_timeout_s expired;
- the engine's own error statuses (vLLM's 400, 404, 503, ...) pass through with their bodies;
  a 503 without Retry-After gets the gateway's, and an error body that is not JSON (a crashed
  engine's "Internal Server Error") becomes an OpenAI error with the same status.

A streamed response is relayed chunk by chunk as the engine sends it. If the engine fails after
the stream has begun, the status can no longer change: the gateway ends the stream with an SSE
`data: {"error": ...}` event, as vLLM itself does. If the client goes away, the server cancels the
handler (handler_cancellation), which aborts the upstream request and releases the slot.

A preemptible tenant's request of a resumable shape (admission_gateway/resume.py) is admitted as
pausable and relayed by admission_gateway/preemptible.py instead: streamed upstream with token
ids, paused when the control plane takes the tenant's borrowed slots back, and resumed as a
continuation of the same answer (docs/preemption.md).

Traces (see docs/operations.md): each /v1 request is a server span named after its route,
continuing the client's W3C trace context if it sent one, with the tenant, the pool, the gateway,
the allocation version and the outcome as attributes (never the API key); its queue wait is a
child span ("queue wait"), its call to the engine a client span ("upstream POST /v1/...") whose
context goes to the engine in `traceparent`. An admitted request's span links to the decision
whose allocation admitted it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from opentelemetry import trace

from admission_gateway.admission import AdmissionClosed, QueueFull, QueueTimeout, Slot
from admission_gateway.auth import AuthenticationError, Authenticator
from admission_gateway.errors import (
    OpenAIError,
    engine_failed,
    sse_error_event,
    upstream_timeout,
    upstream_unavailable,
    write_quietly,
)
from admission_gateway.first_token import FirstTokenDetector
from admission_gateway.gateway_state import GatewayState, TenantState
from admission_gateway.metrics import GatewayMetrics
from admission_gateway.preemptible import PreemptibleRelay
from admission_gateway.resume import not_resumable
from admission_gateway.upstream import EngineClient
from slotshift.clock import Clock
from slotshift.trace_context import inject_into, parent_from

logger = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# The engine needs no credentials, and the client's key must go no further than the gateway.
_NOT_FORWARDED_UPSTREAM = _HOP_BY_HOP | {"host", "content-length", "authorization", "x-request-id"}
_NOT_FORWARDED_DOWNSTREAM = _HOP_BY_HOP | {"content-length", "server", "date", "x-request-id"}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

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
        self._preemptible = (
            PreemptibleRelay(
                engine=engine,
                engine_url=engine_url,
                upstream_timeout_s=upstream_timeout_s,
                paused_keepalive_interval_s=paused_keepalive_interval_s,
                metrics=metrics,
                clock=clock,
                tracer=self._tracer,
            )
            if preemption_enabled
            else None
        )
        """Serves preemptible tenants' resumable requests; None when preemption is off."""
        self.gateway_id = gateway_id
        """This gateway's id, on every request's span (set by the gateway once it is bound)."""
        self._authenticator = authenticator
        self._engine = engine
        self._engine_url = engine_url.rstrip("/")
        self._upstream_timeout = aiohttp.ClientTimeout(total=upstream_timeout_s)
        self._max_body_bytes = max_body_bytes
        self._retry_after = {"Retry-After": str(retry_after_s)}
        self._metrics = metrics
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
        return await self._forward(request, path, None, tenant=None, arrived=None)

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
                _record_status(span, error.status, error.code or error.error_type)
                raise
            except web.HTTPException as exc:
                _record_status(span, exc.status, None)
                raise
            except asyncio.CancelledError:
                span.set_attribute("error.type", "client_disconnected")
                raise
            except Exception as exc:
                span.record_exception(exc)
                _record_status(span, 500, type(exc).__name__)
                raise
            _record_status(span, response.status, None)
            return response

    async def _generate(
        self, request: web.Request, path: str, span: trace.Span
    ) -> web.StreamResponse:
        arrived = self._clock.monotonic()
        tenant = self._state.tenants[self._tenant_of(request)]
        span.set_attribute("slotshift.tenant", tenant.name)
        self._refuse_if_draining()
        body = await self._read_body(request)
        document = _require_json_object(body)
        if tenant.preemptible and self._preemptible is not None:
            why_not = not_resumable(path, document)
            span.set_attribute("slotshift.resumable", why_not is None)
            if why_not is None:
                return await self._serve_resumable(request, path, document, tenant, span, arrived)
        async with await self._admit(tenant, span):
            return await self._forward(request, path, body, tenant=tenant, arrived=arrived)

    async def _serve_resumable(
        self,
        request: web.Request,
        path: str,
        document: dict[str, Any],
        tenant: TenantState,
        span: trace.Span,
        arrived: float,
    ) -> web.StreamResponse:
        """A preemptible tenant's resumable request: admitted as pausable and relayed across
        pauses (admission_gateway/preemptible.py)."""
        assert self._preemptible is not None
        request_id = _request_id(request)
        headers = _forwardable(request.headers, _NOT_FORWARDED_UPSTREAM)
        headers["X-Request-Id"] = request_id
        document = await self._preemptible.with_prompt_ids(path, document, headers)
        slot = await self._admit(tenant, span, pausable=True)
        response_headers: CIMultiDict[str] = CIMultiDict({"X-Request-Id": request_id})
        return await self._preemptible.serve(
            request,
            path=path,
            document=document,
            headers=headers,
            response_headers=response_headers,
            tenant=tenant,
            slot=slot,
            arrived=arrived,
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
        self, tenant: TenantState, span: trace.Span, *, pausable: bool = False
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
        self._metrics.observe_queue_wait(tenant.name, slot.queue_wait_s)
        return slot

    async def _forward(
        self,
        request: web.Request,
        path: str,
        body: bytes | None,
        *,
        tenant: TenantState | None,
        arrived: float | None,
    ) -> web.StreamResponse:
        url = self._engine_url + path
        with self._tracer.start_as_current_span(
            f"upstream {request.method} {path}",
            kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": request.method, "url.full": url},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await self._call_engine(
                    request, url, body, span, tenant=tenant, arrived=arrived
                )
            except OpenAIError as error:
                _record_status(span, error.status, error.code or error.error_type, client=True)
                raise
            except asyncio.CancelledError:
                span.set_attribute("error.type", "client_disconnected")
                raise
            return response

    async def _call_engine(
        self,
        request: web.Request,
        url: str,
        body: bytes | None,
        span: trace.Span,
        *,
        tenant: TenantState | None,
        arrived: float | None,
    ) -> web.StreamResponse:
        request_id = _request_id(request)
        headers = _forwardable(request.headers, _NOT_FORWARDED_UPSTREAM)
        headers["X-Request-Id"] = request_id
        # The engine continues this trace (vLLM does with --otlp-traces-endpoint); the client's
        # own traceparent, if any, is this span's ancestor.
        inject_into(headers, span)
        try:
            upstream = await self._engine.send(
                request.method,
                url,
                data=body,
                headers=headers,
                client_timeout=self._upstream_timeout,
            )
        except TimeoutError:
            raise upstream_timeout() from None
        except aiohttp.ClientError as exc:
            raise _upstream_failed(exc) from None
        _record_status(span, upstream.status, None, client=True)
        try:
            if upstream.status == 200 and upstream.content_type == "text/event-stream":
                return await self._relay_stream(request, upstream, request_id, tenant, arrived)
            try:
                content = await upstream.read()
            except TimeoutError:
                raise upstream_timeout() from None
            except aiohttp.ClientError as exc:
                raise _upstream_failed(exc) from None
            if tenant is not None and arrived is not None and upstream.status < 400:
                self._observe_e2e(tenant, arrived)
            if upstream.status >= 400 and upstream.content_type != "application/json":
                # A crashed handler in the engine's web server answers plain text; OpenAI
                # clients read errors as JSON.
                raise engine_failed(upstream.status, content)
            response_headers = _forwardable(upstream.headers, _NOT_FORWARDED_DOWNSTREAM)
            response_headers["X-Request-Id"] = request_id
            if upstream.status == 503 and "Retry-After" not in response_headers:
                # vLLM's admission rejection (--max-num-queued-reqs) names no time; say when
                # to come back, as the gateway's own 503s do.
                response_headers.update(self._retry_after)
            return web.Response(status=upstream.status, body=content, headers=response_headers)
        except BaseException:
            # Closing (not releasing) drops the connection, which is how the engine learns that
            # nobody waits for this request any more and aborts it.
            upstream.close()
            raise
        finally:
            upstream.release()

    async def _relay_stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        request_id: str,
        tenant: TenantState | None,
        arrived: float | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=upstream.status,
            headers=_forwardable(upstream.headers, _NOT_FORWARDED_DOWNSTREAM),
        )
        response.headers["X-Request-Id"] = request_id
        await response.prepare(request)
        first_token = FirstTokenDetector()
        while True:
            try:
                chunk = await upstream.content.readany()
            except TimeoutError:
                upstream.close()
                await write_quietly(response, sse_error_event(upstream_timeout()))
                return response
            except aiohttp.ClientError as exc:
                upstream.close()
                await write_quietly(response, sse_error_event(_upstream_failed(exc)))
                return response
            if not chunk:
                break
            try:
                await response.write(chunk)
            except ConnectionResetError:
                logger.debug("client went away during stream %s", request_id)
                upstream.close()
                return response
            if (
                tenant is not None
                and arrived is not None
                and not first_token.found
                and first_token.feed(chunk)
            ):
                elapsed = self._clock.monotonic() - arrived
                tenant.ttft.observe(elapsed)
                self._metrics.observe_time_to_first_token(tenant.name, elapsed)
        if tenant is not None and arrived is not None:
            self._observe_e2e(tenant, arrived)
        return response

    def _observe_e2e(self, tenant: TenantState, arrived: float) -> None:
        elapsed = self._clock.monotonic() - arrived
        tenant.e2e.observe(elapsed)
        self._metrics.observe_e2e_latency(tenant.name, elapsed)


def _record_status(
    span: trace.Span, status: int, error: str | None, *, client: bool = False
) -> None:
    """The HTTP status on a span; 5xx, and 4xx on a client span, mark it failed (the HTTP
    semantic conventions); `error` is the gateway's error code when it answered itself."""
    span.set_attribute("http.response.status_code", status)
    if error is not None:
        span.set_attribute("error.type", error)
    if status >= 500 or (client and status >= 400):
        span.set_status(trace.StatusCode.ERROR, error or str(status))


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


def _request_id(request: web.Request) -> str:
    offered = request.headers.get("X-Request-Id", "")
    if _REQUEST_ID.fullmatch(offered):
        return offered
    return uuid.uuid4().hex


def _forwardable(headers: Mapping[str, str], dropped: frozenset[str]) -> CIMultiDict[str]:
    """The headers a proxy passes on: not hop-by-hop, not dropped, not named by Connection."""
    named_by_connection = {
        token.strip().lower()
        for name, value in headers.items()
        if name.lower() == "connection"
        for token in value.split(",")
    }
    forwarded: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered not in dropped and lowered not in named_by_connection:
            forwarded.add(name, value)
    return forwarded


def _upstream_failed(exc: BaseException) -> OpenAIError:
    logger.warning("engine request failed: %s: %s", type(exc).__name__, exc)
    return upstream_unavailable()
