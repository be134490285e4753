"""Relaying a request to the engine and its answer back: the gateway's upstream side.

`EngineRelay.forward` sends an admitted request (or a /v1/models query) to the pool's engine
through the shared EngineClient (upstream.py: the connection pool, and the one retry of a request
the engine never received), in a client span ("upstream POST /v1/...") whose context goes to the
engine in `traceparent`, and relays the answer:

- a streamed answer chunk by chunk as the engine sends it (aligned on its events, less the usage
  event the gateway asked for on a client's behalf, when tokens are counted: token_usage.py). If
  the engine fails after the stream has begun, the status can no longer change: the stream ends
  with an SSE `data: {"error": ...}` event, as vLLM itself does;
- any other answer whole, with the engine's own status (vLLM's 400, 404, 503, ...) and body; a
  503 without Retry-After gets the gateway's, and an error body that is not JSON (a crashed
  engine's "Internal Server Error") becomes an OpenAI error with the same status;
- 502 when the engine could not be reached or dropped the connection, 504 when
  upstream_timeout_s expired.

Hop-by-hop headers go neither way, nor the client's API key to the engine; every answer carries
the request's X-Request-Id. A cancelled handler (the client went away) closes the upstream
connection, which is how the engine learns to abort the request.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Mapping

from multidict import CIMultiDict
from opentelemetry import trace

from admission_gateway.errors import (
    OpenAIError,
    engine_failed,
    sse_error_event,
    upstream_timeout,
    upstream_unavailable,
    write_quietly,
)
from admission_gateway.figures import RequestObservation
from admission_gateway.http_server import Request, Response, StreamResponse
from admission_gateway.resume import DONE_EVENT
from admission_gateway.upstream import EngineClient, EngineError, EngineResponse, PushedReads
from slotshift.aiotasks import in_own_task
from slotshift.request_log import Outcome
from slotshift.trace_context import inject_into

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
NOT_FORWARDED_UPSTREAM = _HOP_BY_HOP | {"host", "content-length", "authorization", "x-request-id"}
"""Client headers the engine does not get: it needs no credentials, and the client's key must go
no further than the gateway (X-Request-Id is set anew, see `request_id`)."""
NOT_FORWARDED_DOWNSTREAM = _HOP_BY_HOP | {"content-length", "server", "date", "x-request-id"}
"""Engine headers the client does not get."""
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_EVENT_END_FRAMED = b"\n\n\r\n"
"""How a framed read whose last chunk ends an SSE event ends."""


class EngineRelay:
    """Forwards requests to one engine and relays its answers (see the module docstring)."""

    def __init__(
        self,
        *,
        engine: EngineClient,
        engine_url: str,
        upstream_timeout_s: float,
        retry_after: Mapping[str, str],
        tracer: trace.Tracer,
    ) -> None:
        self._engine = engine
        self._engine_url = engine_url.rstrip("/")
        self._upstream_timeout_s = upstream_timeout_s
        self._retry_after = dict(retry_after)
        self._tracer = tracer

    async def forward(
        self,
        request: Request,
        path: str,
        body: bytes | None,
        *,
        observed: RequestObservation | None,
    ) -> StreamResponse:
        """`request` (with `body`, read already) sent to the engine's `path`, its answer
        relayed. With `observed` (an admitted generation request), the answer's figures are
        recorded there. Raises OpenAIError for the errors the client gets as a status (502, 504,
        the engine's non-JSON errors)."""
        url = self._engine_url + path
        with self._tracer.start_as_current_span(
            f"upstream {request.method} {path}",
            kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": request.method, "url.full": url},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await self._call_engine(request, url, body, span, observed=observed)
            except OpenAIError as error:
                record_status(span, error.status, error.code or error.error_type, client=True)
                raise
            except asyncio.CancelledError:
                span.set_attribute("error.type", "client_disconnected")
                raise
            return response

    async def _call_engine(
        self,
        request: Request,
        url: str,
        body: bytes | None,
        span: trace.Span,
        *,
        observed: RequestObservation | None,
    ) -> StreamResponse:
        rid = request_id(request)
        headers = forwardable(request.headers, NOT_FORWARDED_UPSTREAM)
        headers["X-Request-Id"] = rid
        # The engine continues this trace (vLLM does with --otlp-traces-endpoint); the client's
        # own traceparent, if any, is this span's ancestor.
        inject_into(headers, span)
        # The stream's pushed events are waited for with the request's own total timeout.
        deadline_s = asyncio.get_running_loop().time() + self._upstream_timeout_s
        try:
            upstream = await self._engine.send(
                request.method,
                url,
                data=body,
                headers=headers,
                timeout_s=self._upstream_timeout_s,
            )
        except TimeoutError:
            raise upstream_timeout() from None
        except EngineError as exc:
            raise upstream_failed(exc) from None
        record_status(span, upstream.status, None, client=True)
        try:
            if upstream.status == 200 and upstream.content_type == "text/event-stream":
                return await in_own_task(
                    self._relay_stream(request, upstream, rid, observed, deadline_s),
                    name=f"relay {rid}",
                )
            try:
                content = await upstream.read()
            except TimeoutError:
                raise upstream_timeout() from None
            except EngineError as exc:
                raise upstream_failed(exc) from None
            if observed is not None:
                observed.answered(upstream.status, content)
            if upstream.status >= 400 and upstream.content_type != "application/json":
                # A crashed handler in the engine's web server answers plain text; OpenAI
                # clients read errors as JSON.
                raise engine_failed(upstream.status, content)
            response_headers = forwardable(upstream.headers, NOT_FORWARDED_DOWNSTREAM)
            response_headers["X-Request-Id"] = rid
            if upstream.status == 503 and "Retry-After" not in response_headers:
                # vLLM's admission rejection (--max-num-queued-reqs) names no time; say when
                # to come back, as the gateway's own 503s do.
                response_headers.update(self._retry_after)
            return Response(status=upstream.status, body=content, headers=response_headers)
        except BaseException:
            # Closing (not releasing) drops the connection, which is how the engine learns that
            # nobody waits for this request any more and aborts it.
            upstream.close()
            raise
        finally:
            upstream.release()

    async def _relay_stream(
        self,
        request: Request,
        upstream: EngineResponse,
        rid: str,
        observed: RequestObservation | None,
        deadline_s: float,
    ) -> StreamResponse:
        response = _EventStream(
            status=upstream.status,
            headers=forwardable(upstream.headers, NOT_FORWARDED_DOWNSTREAM),
        )
        response.headers["X-Request-Id"] = rid
        await response.prepare(request)
        content = upstream.content
        pushed: PushedReads | None = None
        push_tried = False
        try:
            while True:
                try:
                    chunk = None if pushed is None else await pushed.wait(deadline_s)
                    pushed = None
                    if chunk is None:
                        chunk = await content.readany()
                except TimeoutError:
                    upstream.close()
                    return await _end_stream(response, upstream_timeout(), observed)
                except EngineError as exc:
                    upstream.close()
                    return await _end_stream(response, upstream_failed(exc), observed)
                # The engine's [DONE] and its end of body mostly come in one read: the client
                # then gets the last events and the end of the stream in one write (one system
                # call and one wake-up of the client fewer a stream). Only a read ending in
                # [DONE] is asked whether the body ended, so other events pay one C call for it.
                ended = not chunk or (chunk.endswith(DONE_EVENT) and content.at_eof())
                if observed is not None:
                    if chunk:
                        chunk = observed.streamed(chunk)
                    if ended:
                        chunk += observed.streamed(b"")
                try:
                    if ended:
                        await response.write_eof(chunk)
                        break
                    if chunk:
                        await response.write(chunk)
                except ConnectionResetError:
                    logger.debug("client went away during stream %s", rid)
                    upstream.close()
                    if observed is not None:
                        observed.cut(Outcome.CANCELLED, "client_disconnected")
                    return response
                if not push_tried and chunk:
                    # The headers went out with this write: the events after it go to the
                    # client from the engine connection's reads (a read ending in [DONE] comes
                    # back here, to be joined with the end of the stream).
                    push_tried = True
                    pushed = _push_events(request, response, upstream, observed)
        finally:
            if pushed is not None:
                pushed.stop()
        if observed is not None:
            observed.completed()
        return response


def _push_events(
    request: Request,
    response: StreamResponse,
    upstream: EngineResponse,
    observed: RequestObservation | None,
) -> PushedReads | None:
    """`upstream`'s events written to `response`'s client from its connection's reads."""
    client = ImmediateWrites.of(request, response)
    if client is None:
        return None

    def take(chunk: bytes) -> bool:
        if chunk.endswith(DONE_EVENT) or not client.ready():
            return False
        if observed is not None:
            chunk = observed.streamed(chunk)
        if chunk:
            client.write(chunk)
        return True

    transport, high_water = client.transport, client.high_water
    framed_counted = None if observed is None else observed.streamed_framed

    def take_framed(read: bytes) -> bool:
        # The engine's chunks are the client's, so the read goes out as it came, unless it
        # holds [DONE] (joined with the stream's end), some chunk of it does not end an event
        # (a chunk's two CRLFs are all it has then, and the searches below see whole events),
        # the client does not keep up (`client.ready`, inline: this runs for every event), or
        # the accounting must read it (observed.streamed_framed).
        line_ends = read.count(b"\r\n")
        if (
            read.rfind(b"[DONE]") >= 0
            or not read.endswith(_EVENT_END_FRAMED)
            or (line_ends != 2 and line_ends != 2 * read.count(_EVENT_END_FRAMED))
            or transport.is_closing()
            or transport.get_write_buffer_size() > high_water
            or (framed_counted is not None and not framed_counted(read))
        ):
            return False
        transport.write(read)
        return True

    return PushedReads.start(upstream, take, take_framed=take_framed)


class ImmediateWrites:
    """Writes to a streamed response's client at once, framed as the server frames a chunked body,
    for a relay that writes from the engine connection's read callback (upstream.PushedReads),
    where nothing can be awaited: `ready` says whether the client takes more now (False: it is
    gone, or not keeping up, its transport's buffer over the high-water mark; the relay then
    writes through the response, which waits for it)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.high_water = transport.get_write_buffer_limits()[1]
        """`ready` while the transport buffers at most this many bytes."""

    @classmethod
    def of(cls, request: Request, response: StreamResponse) -> ImmediateWrites | None:
        """For `response`, whose headers have been sent; None when its body is not chunked
        (an HTTP/1.0 client's ends with the connection) or is compressed."""
        transport = request.transport
        chunked = response.headers.get("Transfer-Encoding", "").lower() == "chunked"
        if not chunked or response.compression or transport is None:
            return None
        return cls(transport)

    def ready(self) -> bool:
        transport = self.transport
        return not transport.is_closing() and transport.get_write_buffer_size() <= self.high_water

    def write(self, chunk: bytes) -> None:
        self.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))


class _EventStream(StreamResponse):
    """A relayed stream whose headers go out with its first event, in one write: a separate
    write of the headers costs a system call and a client wake-up before the first token
    (a whole `Response` goes out in one write too)."""

    send_headers_immediately = False


async def _end_stream(
    response: StreamResponse, error: OpenAIError, observed: RequestObservation | None
) -> StreamResponse:
    """End a stream under way with `error`'s event."""
    if observed is not None:
        observed.cut_by(error)
    await write_quietly(response, sse_error_event(error))
    return response


def record_status(
    span: trace.Span, status: int, error: str | None, *, client: bool = False
) -> None:
    """The HTTP status on a span; 5xx, and 4xx on a client span, mark it failed (the HTTP
    semantic conventions); `error` is the gateway's error code when it answered itself."""
    span.set_attribute("http.response.status_code", status)
    if error is not None:
        span.set_attribute("error.type", error)
    if status >= 500 or (client and status >= 400):
        span.set_status(trace.StatusCode.ERROR, error or str(status))


def request_id(request: Request) -> str:
    """The id the request goes by upstream and in its answer: the client's X-Request-Id when it
    is a plausible id (1 to 128 of `A-Za-z0-9._:-`), else a new random one."""
    offered = request.headers.get("X-Request-Id", "")
    if _REQUEST_ID.fullmatch(offered):
        return offered
    # A uuid4's hex form without its system call and object: an id needs to be unique, not
    # secret (a client may name its own).
    return f"{random.getrandbits(128):032x}"


def forwardable(headers: Mapping[str, str], dropped: frozenset[str]) -> CIMultiDict[str]:
    """The headers a proxy passes on: not hop-by-hop, not dropped, not named by Connection."""
    forwarded: CIMultiDict[str] = CIMultiDict()
    named_by_connection: list[str] = []
    # One pass, each name lowered once (this runs twice a request); what Connection names
    # goes afterwards (rare: a client's own hop-by-hop headers).
    for name, value in headers.items():
        lowered = name.lower()
        if lowered == "connection":
            named_by_connection += value.split(",")
        elif lowered not in dropped:
            forwarded.add(name, value)
    for token in named_by_connection:
        forwarded.popall(token.strip(), None)
    return forwarded


def upstream_failed(exc: BaseException) -> OpenAIError:
    """The 502 a client gets when the engine could not be reached or dropped the connection;
    the cause is logged (a warning), since the client's answer does not name it."""
    logger.warning("engine request failed: %s: %s", type(exc).__name__, exc)
    return upstream_unavailable()
