"""The OpenAI-compatible reverse proxy's handlers: authenticate, admit within the tenant's
limit, forward.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (streamed or not) take a slot of
the caller's tenant for as long as the engine works on them; `GET /v1/models` needs a key but no
slot. A gateway fronts one or more pools: a request goes to a pool that serves its `model` among
those its tenant may use, and to the replica where the tenant has the most room (routing.py);
`/v1/models` lists the tenant's models (a gateway fronting one pool that names none forwards it
to the engine, and sends every request there). Everything goes to the chosen pool's engine
through its EngineRelay (relay.py), which relays the answer and says how the engine's failures
reach the client.

Errors the gateway answers itself are OpenAI-style JSON bodies (see errors.py):
- 401 missing, malformed or unknown API key;
- 400 a body that is not a JSON object; 413 a body over max_body_bytes;
- 404 `model_not_found` (`param: model`): no pool the tenant may use serves the model (unknown
  and forbidden models look alike); 400 `missing_model`: no model named and the tenant has
  several;
- 429 with Retry-After: the tenant's queue at this gateway is full;
- 503 with Retry-After: no slot within queue_timeout_s (the request waited its turn and the
  tenant's limit stayed full), or the gateway is shutting down;
- 502, 504 and the engine's own statuses: see relay.py.

If the client goes away, the server cancels the handler (handler_cancellation), which aborts the
upstream request and releases the slot.

A preemptible tenant's request of a resumable shape (admission_gateway/resume.py) is admitted as
pausable and relayed by admission_gateway/preemptible.py instead: streamed upstream with token
ids, paused when the control plane takes the tenant's borrowed slots back, and resumed as a
continuation of the same answer (docs/preemption.md). A paused request resumes on the replica it
ran on (its prefix is cached there); only one whose engine is lost moves: it goes on at another
replica of its model that is up for its tenant (the one with the most room, by routing.py's
rule), on a slot of its tenant there. Other requests on a lost engine fail (502, or the engine's
own 503).

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
import contextlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.context import Context

from admission_gateway.admission import AdmissionClosed, QueueFull, QueueTimeout, Slot
from admission_gateway.auth import AuthenticationError, Authenticator
from admission_gateway.errors import OpenAIError
from admission_gateway.figures import RequestFigures, RequestObservation
from admission_gateway.gateway_state import GatewayState, TenantState
from admission_gateway.http_server import Request, Route, StreamResponse, get, json_response, post
from admission_gateway.metrics import GatewayMetrics
from admission_gateway.preemptible import PreemptibleRelay, Replica
from admission_gateway.prompt_tokens import PromptCounter
from admission_gateway.relay import (
    NOT_FORWARDED_UPSTREAM,
    EngineRelay,
    forwardable,
    record_status,
    request_id,
)
from admission_gateway.request_cost import prompt_size, request_cost
from admission_gateway.resume import not_resumable
from admission_gateway.routing import (
    ModelNotFound,
    ModelRequired,
    RoutingError,
    route,
    tenant_models,
)
from admission_gateway.upstream import EngineClient
from slotshift.clock import Clock
from slotshift.config import RequestCostConfig
from slotshift.trace_context import inject_into, parent_from

logger = logging.getLogger(__name__)

_Handler = Callable[[Request, str, trace.Span], Awaitable[StreamResponse]]


@dataclass(frozen=True, slots=True)
class PoolEndpoint:
    """A pool this gateway fronts, as the proxy needs it."""

    state: GatewayState
    engine: EngineClient
    engine_url: str
    models: tuple[str, ...] = ()
    """The models its engine serves (routing.py); empty: whatever a request names."""
    preemption_enabled: bool = True
    request_cost: RequestCostConfig | None = None
    """How the pool weighs a request in slots (pools[].request_cost); None: one slot each."""


class PoolFront:
    """One fronted pool at run time: its tenants' admission and the relays to its engine."""

    def __init__(
        self,
        endpoint: PoolEndpoint,
        *,
        upstream_timeout_s: float,
        retry_after: Mapping[str, str],
        paused_keepalive_interval_s: float,
        tracer: trace.Tracer,
        clock: Clock,
        down_s: float,
    ) -> None:
        self.state = endpoint.state
        self.models = endpoint.models
        self._clock = clock
        self._down_s = down_s
        self._down_until_s = -math.inf
        self.relay = EngineRelay(
            engine=endpoint.engine,
            engine_url=endpoint.engine_url,
            upstream_timeout_s=upstream_timeout_s,
            retry_after=retry_after,
            tracer=tracer,
        )
        endpoint.engine.on_unreachable = self.engine_unreachable
        self.preemptible = (
            PreemptibleRelay(
                engine=endpoint.engine,
                engine_url=endpoint.engine_url,
                upstream_timeout_s=upstream_timeout_s,
                paused_keepalive_interval_s=paused_keepalive_interval_s,
                tracer=tracer,
            )
            if endpoint.preemption_enabled
            else None
        )
        """Serves preemptible tenants' resumable requests; None when preemption is off."""
        self.request_cost = endpoint.request_cost
        cost = endpoint.request_cost
        self.prompt_counter = (
            PromptCounter(
                engine=endpoint.engine,
                engine_url=endpoint.engine_url,
                timeout_s=cost.tokenize_timeout_s,
            )
            if cost is not None and cost.prompt_estimate == "tokenize"
            else None
        )
        """Asks the engine for prompts' token counts; None unless the pool weighs by them."""

    async def cost_slots(
        self, document: Mapping[str, Any], span: trace.Span, observed: RequestObservation
    ) -> int:
        """Slots the request `document` holds here: 1 unless the pool weighs requests
        (admission_gateway/request_cost.py), the estimate then put on the request's span (and,
        when the engine counted the prompt, on its observation: a cut stream's prompt count)."""
        config = self.request_cost
        if config is None:
            return 1
        counted: int | None = None
        tokenizable = prompt_size(document).tokenizable
        if self.prompt_counter is not None and tokenizable is not None:
            headers: dict[str, str] = {}
            inject_into(headers, span)
            counted = await self.prompt_counter.count(tokenizable, document.get("model"), headers)
        failed = self.prompt_counter is not None and tokenizable is not None and counted is None
        if failed:
            self.state.prompt_estimate_fallbacks_total += 1
        cost = request_cost(document, config, counted_prompt_tokens=counted, tokenize_failed=failed)
        span.set_attributes(
            {
                "slotshift.request.cost_slots": cost.slots,
                "slotshift.request.prompt_tokens_estimate": cost.prompt_tokens,
                "slotshift.request.max_tokens_charged": cost.max_tokens,
                "slotshift.request.cost_estimated_by": cost.estimated_by,
            }
        )
        if cost.estimated_by in ("tokenize", "token_ids"):
            observed.prompt_counted(cost.prompt_tokens)
        return cost.slots

    @property
    def name(self) -> str:
        return self.state.pool_name

    @property
    def available(self) -> bool:
        """routing.Front.available: not within `down_s` of its engine last being unreachable."""
        return self._clock.monotonic() >= self._down_until_s

    def engine_unreachable(self) -> None:
        """Its engine could not be reached: routing passes it over for `down_s`."""
        if self.available:
            logger.warning(
                "engine of pool %s unreachable; routing around it for %.1f s",
                self.name,
                self._down_s,
            )
        self._down_until_s = self._clock.monotonic() + self._down_s

    def room(self, tenant: str) -> tuple[int, int] | None:
        """routing.Front.room: the tenant's free slots here less its queue, and its in flight
        (GatewayState.room)."""
        return self.state.room(tenant)


class OpenAIProxy:
    """The /v1 handlers of one gateway, in front of one or more pools."""

    def __init__(
        self,
        *,
        pools: Sequence[PoolEndpoint],
        authenticator: Authenticator,
        upstream_timeout_s: float,
        max_body_bytes: int,
        retry_after_s: int,
        metrics: GatewayMetrics,
        clock: Clock,
        tracer: trace.Tracer | None = None,
        gateway_id: str = "",
        paused_keepalive_interval_s: float = 5.0,
        replica_down_s: float = 2.0,
        count_tokens: bool = True,
    ) -> None:
        if not pools:
            raise ValueError("a gateway fronts at least one pool")
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        self._retry_after = {"Retry-After": str(retry_after_s)}
        self.figures = RequestFigures(metrics, clock, count_tokens=count_tokens)
        """Where every request's figures go (the gateway points it at the request log)."""
        self._fronts = [
            PoolFront(
                endpoint,
                upstream_timeout_s=upstream_timeout_s,
                retry_after=self._retry_after,
                paused_keepalive_interval_s=paused_keepalive_interval_s,
                tracer=self._tracer,
                clock=clock,
                down_s=replica_down_s,
            )
            for endpoint in pools
        ]
        self._by_name = {front.name: front for front in self._fronts}
        self._turn = 0
        """Requests routed so far: replicas tied on room take turns by it."""
        only = self._fronts[0]
        self._only = only if len(self._fronts) == 1 and not only.models else None
        """The one pool of a gateway that fronts one naming no models: every request goes
        there, whatever its model (the engine answers for the model itself)."""
        self.gateway_id = gateway_id
        """This gateway's id, on every request's span (set by the gateway once it is bound)."""
        self._authenticator = authenticator
        self._max_body_bytes = max_body_bytes
        self._clock = clock
        self.accepting = True
        """False once the gateway drains: new requests get 503."""

    def routes(self) -> list[Route]:
        return [
            post("/v1/completions", self.completions),
            post("/v1/chat/completions", self.chat_completions),
            get("/v1/models", self.models),
        ]

    async def completions(self, request: Request) -> StreamResponse:
        return await self._traced(request, "/v1/completions", self._generate)

    async def chat_completions(self, request: Request) -> StreamResponse:
        return await self._traced(request, "/v1/chat/completions", self._generate)

    async def models(self, request: Request) -> StreamResponse:
        return await self._traced(request, "/v1/models", self._models)

    async def _models(self, request: Request, path: str, span: trace.Span) -> StreamResponse:
        """The models the caller's tenant may use: the engine's own answer when the gateway
        fronts one pool that names none, else the models of the pools the tenant is in."""
        tenant = self._tenant_of(request)
        span.set_attribute("slotshift.tenant", tenant)
        self._refuse_if_draining()
        if self._only is not None:
            return await self._only.relay.forward(request, path, None, observed=None)
        return json_response(
            {
                "object": "list",
                "data": [
                    {"id": model, "object": "model", "created": 0, "owned_by": "slotshift"}
                    for model in tenant_models(self._fronts, tenant)
                ],
            }
        )

    async def _traced(self, request: Request, path: str, handler: _Handler) -> StreamResponse:
        """Run `handler` in the request's server span, and record how the request ended."""
        with self._tracer.start_as_current_span(
            f"{request.method} {path}",
            context=_client_context(request.headers),
            kind=trace.SpanKind.SERVER,
            attributes={
                "http.request.method": request.method,
                "http.route": path,
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
            except asyncio.CancelledError:
                span.set_attribute("error.type", "client_disconnected")
                raise
            except Exception as exc:
                span.record_exception(exc)
                record_status(span, 500, type(exc).__name__)
                raise
            record_status(span, response.status, None)
            return response

    async def _generate(self, request: Request, path: str, span: trace.Span) -> StreamResponse:
        arrived = self._clock.monotonic()
        name = self._tenant_of(request)
        span.set_attribute("slotshift.tenant", name)
        body: bytes | None = None
        document: dict[str, Any] | None = None
        front = self._only
        if front is None:
            # The pool follows from the body's model: read it first. Refusals before the pool is
            # known (a draining gateway, a bad body, no such model) are no pool's figures.
            self._refuse_if_draining()
            body = await self._read_body(request)
            document = _require_json_object(body)
            front = self._route(name, document)
        span.set_attribute("slotshift.pool", front.name)
        tenant = front.state.tenants.get(name)
        if tenant is None:
            raise _model_not_found(str(document.get("model")) if document else "")
        observed = self.figures.begin(tenant, arrived, route=path, headers=request.headers)
        try:
            response = await self._serve(request, path, span, observed, front, body, document)
        except BaseException as exc:
            observed.failed(exc)
            raise
        observed.responded(response.status)
        return response

    def _route(self, tenant: str, document: Mapping[str, Any]) -> PoolFront:
        """The pool for a request of `tenant` with this body (routing.py)."""
        model = document.get("model")
        if model is not None and not isinstance(model, str):
            raise OpenAIError(
                400,
                "'model' must be a string.",
                error_type="invalid_request_error",
                code="invalid_type",
                param="model",
            )
        self._turn += 1
        try:
            routed = route(self._fronts, tenant, model, self._turn)
        except ModelNotFound as exc:
            raise _model_not_found(exc.model) from None
        except ModelRequired as exc:
            raise OpenAIError(
                400,
                str(exc),
                error_type="invalid_request_error",
                code="missing_model",
                param="model",
            ) from None
        return self._by_name[routed.pool]

    async def _serve(
        self,
        request: Request,
        path: str,
        span: trace.Span,
        observed: RequestObservation,
        front: PoolFront,
        body: bytes | None,
        document: dict[str, Any] | None,
    ) -> StreamResponse:
        tenant = observed.tenant
        self._refuse_if_draining()
        if body is None or document is None:
            body = await self._read_body(request)
            document = _require_json_object(body)
        # Tokens count under the pool's model, whatever alias was named (routing.py).
        observed.asked(document, model=front.models[0] if front.models else "")
        if tenant.preemptible and front.preemptible is not None:
            why_not = not_resumable(path, document)
            span.set_attribute("slotshift.resumable", why_not is None)
            if why_not is None:
                return await self._serve_resumable(request, path, document, span, observed, front)
        body = observed.upstream_body(document, body)
        cost_slots = await front.cost_slots(document, span, observed)
        async with await self._admit(front, tenant, span, observed, cost_slots=cost_slots):
            return await front.relay.forward(request, path, body, observed=observed)

    async def _serve_resumable(
        self,
        request: Request,
        path: str,
        document: dict[str, Any],
        span: trace.Span,
        observed: RequestObservation,
        front: PoolFront,
    ) -> StreamResponse:
        """A preemptible tenant's resumable request: admitted as pausable and relayed across
        pauses (admission_gateway/preemptible.py)."""
        preemptible = front.preemptible
        assert preemptible is not None
        rid = request_id(request)
        headers = forwardable(request.headers, NOT_FORWARDED_UPSTREAM)
        headers["X-Request-Id"] = rid
        tenant = observed.tenant
        cost_slots = await front.cost_slots(document, span, observed)
        slot = await self._admit(
            front, tenant, span, observed, pausable=True, cost_slots=cost_slots
        )
        response_headers: CIMultiDict[str] = CIMultiDict({"X-Request-Id": rid})
        model = document.get("model")
        return await preemptible.serve(
            request,
            path=path,
            document=document,
            headers=headers,
            response_headers=response_headers,
            tenant=tenant,
            slot=slot,
            observed=observed,
            pool=front.name,
            find_replica=lambda lost: self._replica_for(
                tenant.name, model if isinstance(model, str) else None, lost
            ),
        )

    def _replica_for(self, tenant: str, model: str | None, lost: str) -> Replica | None:
        """Where a resumable request of `tenant` for `model` (None: the tenant's only one) goes
        on when the engine of pool `lost` went away under it: another pool serving the model
        whose engine is up, where the tenant is preemptible and preemption is on, the one with
        the most room (routing.py); None when there is none. The lost pool is passed over by
        routing for `replica_down_s` from now, as an unreachable engine is."""
        lost_front = self._by_name[lost]
        lost_front.engine_unreachable()
        if model is None and lost_front.models:
            model = lost_front.models[0]
        candidates = [
            front
            for front in self._fronts
            if front is not lost_front
            and front.available
            and front.preemptible is not None
            and (state := front.state.tenants.get(tenant)) is not None
            and state.preemptible
        ]
        if not candidates:
            return None
        try:
            routed = route(candidates, tenant, model, self._turn)
        except RoutingError:
            return None
        front = self._by_name[routed.pool]
        assert front.preemptible is not None
        return Replica(front.name, front.preemptible, front.state.tenants[tenant])

    def _tenant_of(self, request: Request) -> str:
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

    async def _read_body(self, request: Request) -> bytes:
        limit = self._max_body_bytes
        length = request.content_length
        if length is not None:
            if length > limit:
                raise _too_large(limit)
            # What a Content-Length announces, read at once (the parser holds no more).
            try:
                return await request.content.readexactly(length)
            except asyncio.IncompleteReadError as exc:
                return exc.partial  # a body cut short is refused as any body that is not JSON
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
        return bytes(body)

    async def _admit(
        self,
        front: PoolFront,
        tenant: TenantState,
        span: trace.Span,
        observed: RequestObservation,
        *,
        pausable: bool = False,
        cost_slots: int = 1,
    ) -> Slot:
        """A slot for the request (worth `cost_slots`), waited for in a "queue wait" span; the
        request's span says whether and under which allocation it was admitted, and links to
        that allocation's decision."""
        admission = tenant.admission
        # A request whose span records nothing (tracing off, or not sampled: its children are
        # not either) builds none of its attributes.
        recording = span.is_recording()
        with self._tracer.start_as_current_span(
            "queue wait",
            attributes={
                "slotshift.tenant": tenant.name,
                "slotshift.tenant.limit_slots": admission.limit_slots,
                "slotshift.tenant.in_flight": admission.in_flight,
                "slotshift.tenant.queued": admission.queued,
            }
            if recording
            else None,
            record_exception=False,
            set_status_on_exception=False,
        ) as waiting:
            try:
                slot = await self._acquire(tenant, pausable=pausable, cost_slots=cost_slots)
                observed.admitted(slot)
            except OpenAIError as error:
                rejected: dict[str, str | int] = {
                    "slotshift.admission.outcome": "rejected",
                    "slotshift.admission.rejection_reason": error.code or error.error_type,
                    "slotshift.allocation.version": front.state.applied_version,
                }
                waiting.set_attributes(rejected)
                waiting.set_status(trace.StatusCode.ERROR, error.code)
                span.set_attributes(rejected)
                raise
        if not recording:
            return slot
        span.set_attributes(
            {
                "slotshift.admission.outcome": "admitted",
                "slotshift.allocation.version": front.state.applied_version,
                "slotshift.queue.wait_s": slot.queue_wait_s,
            }
        )
        if tenant.decision is not None:
            span.add_link(
                tenant.decision,
                {
                    "slotshift.link": "admitted under this decision's allocation",
                    "slotshift.allocation.version": front.state.applied_version,
                },
            )
        return slot

    async def _acquire(self, tenant: TenantState, *, pausable: bool, cost_slots: int) -> Slot:
        try:
            slot = await tenant.admission.acquire(pausable=pausable, cost_slots=cost_slots)
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


def _model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model {model!r} does not exist or you do not have access to it.",
        error_type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


_LONG_DIGITS = re.compile(rb"[0-9]{20}")


def _client_context(headers: Mapping[str, str]) -> Context:
    """The trace context a client's request continues (parent_from), read only when the
    request carries one (`headers` are case-insensitive)."""
    return parent_from(headers) if "traceparent" in headers else Context()


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"Request body is larger than {limit} bytes.",
        error_type="invalid_request_error",
        code="request_too_large",
    )


def _require_json_object(body: bytes) -> dict[str, Any]:
    # orjson (a few times faster: this runs on every request) where it reads a body as the
    # json module does: not where a number of 20 digits or more may be an integer past 64 bits
    # (orjson makes it a float), nor where orjson refuses what json takes (NaN, UTF-16).
    document: Any = None
    if _LONG_DIGITS.search(body) is None:
        with contextlib.suppress(orjson.JSONDecodeError):
            document = orjson.loads(body)
    if document is None:
        document = _json_module_loads(body)
    if not isinstance(document, dict):
        raise OpenAIError(
            400,
            "The request body must be a JSON object.",
            error_type="invalid_request_error",
            code="invalid_json",
        )
    return document


def _json_module_loads(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise OpenAIError(
            400,
            "The request body is not valid JSON.",
            error_type="invalid_request_error",
            code="invalid_json",
        ) from None
