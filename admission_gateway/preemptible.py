"""Relaying a preemptible tenant's resumable request: run it, pause it when asked, resume it.

The mechanism behind "lend my idle capacity, and give it back the moment I need it": when the
control plane tells this gateway to pause some of a preemptible tenant's borrowed work
(`TenantAdmission.set_pause_above`), the admission picks the youngest requests and asks their
slots to pause. This relay, which serves each such request, then

1. closes the request's connection to the engine. That is the signal that the work has left the
   engine: vLLM (and the emulator) abort a request whose connection closes, before their next
   step. Only then is the slot given back (`TenantAdmission.resume`), and the freed slot reaches
   a lender only through the control plane's next grant, which follows this gateway's report;
2. waits at the head of its tenant's queue, never failed: exempt from the queue timeout, the
   queue depth and the shutdown drain; a streamed client gets an SSE comment every
   `paused_keepalive_interval_s` so that idle proxies keep the stream open;
3. continues on a new slot where it stopped: the prompt's token ids plus the tokens generated so
   far, with max_tokens and min_tokens reduced (admission_gateway/resume.py builds it; vLLM's
   prefix cache makes the re-prefill cheap).

The client sees one uninterrupted answer: one stream (or, for a non-streamed request, one
response assembled from the upstream stream), one final usage with the true totals. What shapes
may be resumed is resume.py's `not_resumable` (docs/preemption.md); other requests of the tenant
go the ordinary way and are never paused.

A paused request resumes on the engine it ran on: its prefix is cached there. Only a request
whose engine was lost moves: when an attempt fails because the engine went away (no connection,
a connection reset, a stream cut before its end, or the engine's 503 saying it is shutting down
or aborted the request) and the answer can go on (`Resumption.can_go_on`), the relay asks the
caller's `find_replica` for another pool serving the request's model; if there is one, the slot
at the lost pool is released, the request waits for a slot of its tenant there as a paused one
waits (`TenantAdmission.take_over`), and the next attempt goes to that pool's engine. A streamed
client keeps its one stream throughout: the paused keepalive comments while the request waits
there, then the continuation's events. The continuation is token-exact because replicas of one
model serve the same model with the same tokenizer (what makes them replicas); the prompt's
token ids came from the first engine's stream or its /tokenize. Without another replica the
request fails as any other would: 502 (or the engine's 503 where it said so), or an error event
where the client's stream had begun.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict
from opentelemetry import trace

from admission_gateway.admission import Slot
from admission_gateway.chunked import chunks_data
from admission_gateway.errors import (
    OpenAIError,
    engine_failed,
    sse_error_event,
    upstream_timeout,
    upstream_unavailable,
    write_quietly,
)
from admission_gateway.figures import RequestObservation
from admission_gateway.first_token import FirstTokenDetector
from admission_gateway.gateway_state import TenantState
from admission_gateway.http_server import Request, Response, StreamResponse
from admission_gateway.relay import ImmediateWrites, upstream_failed
from admission_gateway.resume import (
    COMPLETIONS_PATH,
    SSE_KEEPALIVE,
    CannotResume,
    Resumption,
    SseTooLong,
    UpstreamProtocolError,
)
from admission_gateway.upstream import (
    EngineClient,
    EngineCredentialsRefused,
    EngineError,
    EngineResponse,
    PushedReads,
)
from slotshift.aiotasks import in_own_task
from slotshift.request_log import Outcome
from slotshift.trace_context import inject_into

logger = logging.getLogger(__name__)


_ENGINE_GOING_AWAY = (b"shutting down", b"aborted")
"""What an engine's 503 says when it stops (vLLM's and the emulator's shutdown, the abort of
the requests it still held): the request did not fail, its engine went away."""


class _Ended(Exception):
    """An attempt failed in a way the client must see (a status, or an SSE error event)."""

    def __init__(
        self,
        error: OpenAIError,
        refusal: Response | None = None,
        *,
        engine_lost: bool = False,
        client: StreamResponse | None = None,
    ) -> None:
        super().__init__(error.body())
        self.error = error
        self.refusal = refusal
        """The engine's own answer, passed through when the client has seen nothing yet."""
        self.engine_lost = engine_lost
        """The engine went away under the attempt: another replica may carry the answer on."""
        self.client = client
        """The client's stream, where it is open (this attempt may have opened it): the rest
        of the answer, or its error event, goes there and nowhere else."""


class _ClientGone(Exception):
    """The streaming client went away: a write to its stream failed (the server cancels the
    handler too, but a write may come first)."""

    def __init__(self, client: StreamResponse) -> None:
        super().__init__("client went away")
        self.client = client


async def _write(client: StreamResponse, data: bytes) -> None:
    """`data` to the client's stream; _ClientGone when the client went away."""
    try:
        await client.write(data)
    except ConnectionResetError:
        raise _ClientGone(client) from None


@dataclass(frozen=True, slots=True)
class Replica:
    """Another pool whose engine serves the request's model, where a request whose engine was
    lost can go on."""

    pool: str
    relay: PreemptibleRelay
    """That pool's relay: its engine's URL and client (with that engine's API key)."""
    tenant: TenantState
    """The request's tenant at that pool: the slot there is taken from its admission."""


FindReplica = Callable[[str], Replica | None]
"""Given the pool whose engine was lost, another replica for the request, or None (there is
none that is up for its tenant). Must not block."""


@dataclass
class _Accounted:
    """What of one request's token counts is already on its tenant's counters."""

    output: int = 0
    recomputed: int = 0
    discarded: int = 0


class PreemptibleRelay:
    """Serves resumable requests of preemptible tenants (see the module docstring)."""

    def __init__(
        self,
        *,
        engine: EngineClient,
        engine_url: str,
        upstream_timeout_s: float,
        paused_keepalive_interval_s: float,
        tracer: trace.Tracer,
    ) -> None:
        self._engine = engine
        self._engine_url = engine_url.rstrip("/")
        self._timeout_s = upstream_timeout_s
        self._keepalive_s = paused_keepalive_interval_s
        self._tracer = tracer

    async def tokenized_prompt(
        self, path: str, document: Mapping[str, Any], headers: Mapping[str, str]
    ) -> list[int] | None:
        """A text completion's prompt as token ids, from the engine's POST /tokenize (the same
        ids a completion of it gets: special tokens as the request says); None when it is not a
        text completion, or the engine gives no ids (the stream's own ids then apply)."""
        prompt = _text_prompt(path, document)
        if prompt is None:
            return None
        query = {"prompt": prompt, "add_special_tokens": document.get("add_special_tokens", True)}
        if "model" in document:
            query["model"] = document["model"]
        try:
            answer = await self._engine.ask_json(
                self._engine_url + "/tokenize",
                query,
                headers=_tracing_only(headers),
                timeout_s=self._timeout_s,
            )
            tokens = answer["tokens"]
        except (EngineError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            logger.debug("no token ids for a resumable prompt: %s", exc)
            return None
        if not tokens or not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            # An empty prompt of ids is not resumable, where the text was.
            return None
        return tokens

    def _tokenizing(
        self,
        resumption: Resumption,
        path: str,
        document: Mapping[str, Any],
        headers: Mapping[str, str],
        tenant: TenantState,
    ) -> asyncio.Task[None]:
        """The task that gives `resumption` its text prompt's ids from this relay's engine."""

        async def take_prompt_ids() -> None:
            ids = await self.tokenized_prompt(path, document, headers)
            if ids is not None:
                resumption.take_prompt_ids(ids)

        return asyncio.create_task(take_prompt_ids(), name=f"tokenize {tenant.name} prompt")

    async def serve(
        self,
        request: Request,
        *,
        path: str,
        document: Mapping[str, Any],
        headers: CIMultiDict[str],
        response_headers: CIMultiDict[str],
        tenant: TenantState,
        slot: Slot,
        observed: RequestObservation,
        pool: str = "",
        find_replica: FindReplica | None = None,
    ) -> StreamResponse:
        """Run the request to its end across pauses; `slot` is its admitted slot, released
        (or handed on to the next attempt's slot) before this returns. `headers` go to the
        engine; `response_headers` are added to the client's response; the request's figures
        and counts go to `observed`. `pool` is this relay's pool; when its engine is lost under
        the request, `find_replica` (None: never move) names where it may go on (see the
        module docstring); a moved request's counts go to its tenant at the new pool."""
        try:
            resumption = Resumption(path, dict(document))
        except ValueError:
            # The caller checked the document; a slot must never outlive its request.
            slot.release()
            raise
        # A text completion's ids are asked for beside its first attempt, not before its
        # admission: the answer needs them only once it has output to continue, and a round
        # trip before admission would delay its first token and admit it after requests that
        # came later. Until they come, its output (if any) cannot be paused without loss, so
        # pausable() passes it over.
        tokenizing: asyncio.Task[None] | None = None
        if _text_prompt(path, document) is not None:
            tokenizing = self._tokenizing(resumption, path, document, headers, tenant)
        client: StreamResponse | None = None
        first_token = FirstTokenDetector()
        accounted = _Accounted()
        attempt = 0
        relay = self
        try:
            while True:
                attempt += 1
                try:
                    client, finished = await in_own_task(
                        relay._attempt(
                            request,
                            resumption,
                            slot,
                            headers,
                            response_headers,
                            client,
                            first_token,
                            observed,
                            attempt,
                        ),
                        name=f"resumable {tenant.name} attempt {attempt}",
                    )
                except _Ended as ended:
                    # An attempt that opened the client's stream and then failed hands it
                    # over here: a second stream would write a second status line into the
                    # body, which the client's HTTP parser refuses (it drops the connection).
                    client = ended.client or client
                    self._account(tenant, resumption, accounted)
                    replica = (
                        find_replica(pool)
                        if ended.engine_lost and find_replica is not None and resumption.can_go_on()
                        else None
                    )
                    if replica is not None:
                        slot = await self._move(tenant, slot, replica, client, pool)
                        tenant, relay, pool = replica.tenant, replica.relay, replica.pool
                        if tokenizing is not None and not resumption.prompt_ids_known:
                            # The lost engine's answer may never come: the new one's is as good
                            # (replicas share a tokenizer).
                            await _stop(tokenizing)
                            tokenizing = relay._tokenizing(
                                resumption, path, document, headers, tenant
                            )
                        continue
                    if client is not None:
                        observed.cut_by(ended.error)
                        await write_quietly(client, sse_error_event(ended.error))
                        return client
                    if ended.refusal is not None and attempt == 1:
                        ended.refusal.headers.extend(response_headers)
                        return ended.refusal
                    raise ended.error from None
                self._account(tenant, resumption, accounted)
                if finished:
                    break
                if client is None and resumption.client_streams:
                    # Paused before the engine's headers came: the client's stream starts now,
                    # so that the comments sent while paused keep idle proxies from cutting it.
                    client = await _open_stream(request, response_headers)
                slot = await self._keeping_alive(
                    tenant.admission.resume(slot), client, f"resume {tenant.name} request"
                )
        except _ClientGone as gone:
            # As the plain relay does: the engine's work is stopped (the attempt closed its
            # connection), and the request ends as cancelled, not as the gateway's error.
            observed.cut(Outcome.CANCELLED, "client_disconnected")
            return gone.client
        finally:
            slot.release()
            if tokenizing is not None:
                await _stop(tokenizing)
            observed.counted(
                prompt_tokens=resumption.prompt_tokens,
                output_tokens=resumption.generated_tokens,
                pauses=resumption.pauses,
            )
        if resumption.error is not None:
            if client is None:
                return _error_response(resumption.error, response_headers)
            # The engine's error event went to the client as part of the stream.
            observed.cut(Outcome.UPSTREAM_ERROR, "engine_error")
        observed.completed()
        if client is not None:
            await write_quietly(client, b"".join(resumption.final_events()))
            return client
        body = json.dumps(resumption.response()).encode()
        response_headers = CIMultiDict(response_headers)
        response_headers["Content-Type"] = "application/json"
        return Response(status=200, body=body, headers=response_headers)

    async def _attempt(
        self,
        request: Request,
        resumption: Resumption,
        slot: Slot,
        headers: CIMultiDict[str],
        response_headers: CIMultiDict[str],
        client: StreamResponse | None,
        first_token: FirstTokenDetector,
        observed: RequestObservation,
        attempt: int,
    ) -> tuple[StreamResponse | None, bool]:
        """One upstream attempt; returns the client's response (prepared once the engine
        accepted the request, for a streaming client) and whether the answer is complete. An
        `_Ended` raised once that response is prepared carries it."""
        try:
            path, body = resumption.upstream_request()
        except CannotResume as exc:
            raise _Ended(upstream_unavailable(str(exc))) from None
        url = self._engine_url + path
        with self._tracer.start_as_current_span(
            f"upstream POST {path}",
            kind=trace.SpanKind.CLIENT,
            attributes={
                "http.request.method": "POST",
                "url.full": url,
                "slotshift.attempt": attempt,
                "slotshift.resumed": attempt > 1,
            },
        ) as span:
            attempt_headers = CIMultiDict(headers)
            inject_into(attempt_headers, span)
            # Pushed reads are waited for with the attempt's own total timeout.
            deadline_s = asyncio.get_running_loop().time() + self._timeout_s
            try:
                upstream = await self._engine.send(
                    "POST",
                    url,
                    data=body,
                    headers=attempt_headers,
                    timeout_s=self._timeout_s,
                )
            except TimeoutError:
                resumption.attempt_ended()
                raise _Ended(upstream_timeout()) from None
            except EngineError as exc:
                resumption.attempt_ended()
                # A refused key is this gateway's misconfiguration, the same at every replica.
                lost = not isinstance(exc, EngineCredentialsRefused)
                raise _Ended(upstream_failed(exc), engine_lost=lost) from None
            span.set_attribute("http.response.status_code", upstream.status)
            pushed: PushedReads | None = None

            def pause() -> None:
                # Closing the connection is what makes the engine abort the request; the
                # read below ends at once (a pushed one is woken here: an https connection's
                # end can wait for the engine's TLS close).
                upstream.close()
                if pushed is not None:
                    pushed.hand_back(None)

            slot.on_pause(pause, can_pause=resumption.pausable)
            try:
                if upstream.status != 200 or upstream.content_type != "text/event-stream":
                    await self._refused(upstream, resumption, slot)
                elif client is None and resumption.client_streams:
                    client = await _open_stream(request, response_headers)
                # Read through [DONE] (feed ends the attempt there): the usage chunk that comes
                # after the finish says what the prefix cache saved. The reads go to the client
                # from the engine connection's own read callback while nothing else is asked
                # (_push_reads); the task goes on reading here once that hands back.
                pushed = _push_reads(
                    request, upstream, resumption, slot, client, first_token, observed
                )
                while resumption.in_flight and not slot.pause_requested:
                    try:
                        if pushed is None:
                            chunk = await upstream.content.readany()
                        else:
                            handed_back = await pushed.wait(deadline_s)
                            pushed = None
                            if handed_back is None:
                                continue
                            chunk = handed_back
                    except (EngineError, TimeoutError) as exc:
                        if slot.pause_requested:
                            break
                        logger.warning("engine stream failed: %s: %s", type(exc).__name__, exc)
                        break
                    if not chunk:
                        break
                    if slot.pause_requested:
                        # Chosen while the last events were being written: what the engine sent
                        # after them was never delivered, and the continuation starts from what
                        # was (feeding it could make the answer not continuable).
                        break
                    # All the events of one read go to the client in one write (one system
                    # call, not one an event); nothing is awaited between feeding them, so no
                    # pause can come in between.
                    out = resumption.relay(chunk)
                    if client is None or not out:
                        continue
                    try:
                        # Not through _write: its coroutine would cost every read a frame.
                        await client.write(out)
                    except ConnectionResetError:
                        raise _ClientGone(client) from None
                    if not first_token.found and first_token.feed(out):
                        observed.first_token()
            except (UpstreamProtocolError, SseTooLong) as exc:
                upstream.close()
                resumption.attempt_ended()
                logger.warning("engine stream unreadable: %s", exc)
                raise _Ended(upstream_unavailable(), client=client) from None
            except BaseException:
                upstream.close()
                raise
            finally:
                if pushed is not None:
                    pushed.stop()
                slot.on_pause(None)
            if resumption.finished:
                resumption.attempt_ended()
                upstream.release()
                return client, True
            upstream.close()
            if slot.pause_requested:
                # Pausable when chosen; if what was still buffered made it not (a parser's
                # output), the next attempt restarts it or says it cannot.
                if resumption.pausable():
                    resumption.pause()
                else:
                    resumption.attempt_ended()
                span.set_attribute("slotshift.paused", True)
                return client, False
            # Cut before its [DONE] (the connection failed or closed): the engine went away. A
            # [DONE] without a finish is the engine's own odd answer, the same anywhere.
            cut = resumption.in_flight
            resumption.attempt_ended()
            raise _Ended(upstream_unavailable(), engine_lost=cut, client=client)

    async def _refused(self, upstream: EngineResponse, resumption: Resumption, slot: Slot) -> None:
        """Read the engine's answer that is not a stream, and end the request with it; return
        only when a pause cut the read (the attempt then ends as paused)."""
        try:
            content = await upstream.read()
        except (EngineError, TimeoutError) as exc:
            if slot.pause_requested:
                return
            resumption.attempt_ended()
            if isinstance(exc, TimeoutError):
                raise _Ended(upstream_timeout()) from None
            raise _Ended(upstream_unavailable(), engine_lost=True) from None
        resumption.attempt_ended()
        refusal = None
        if upstream.status >= 400 and upstream.content_type == "application/json":
            refusal = Response(
                status=upstream.status, body=content, content_type="application/json"
            )
        going_away = upstream.status == 503 and any(
            words in content.lower() for words in _ENGINE_GOING_AWAY
        )
        raise _Ended(engine_failed(upstream.status, content), refusal, engine_lost=going_away)

    async def _move(
        self,
        tenant: TenantState,
        slot: Slot,
        replica: Replica,
        client: StreamResponse | None,
        lost_pool: str,
    ) -> Slot:
        """Release the lost pool's `slot` and wait for one of the tenant at `replica`'s pool;
        counted as a move out of the one and into the other once the new slot is held."""
        logger.warning(
            "engine of pool %s lost under a resumable request of %s; it goes on at pool %s",
            lost_pool,
            tenant.name,
            replica.pool,
        )
        moved = await self._keeping_alive(
            replica.tenant.admission.take_over(slot),
            client,
            f"move {tenant.name} request to {replica.pool}",
        )
        tenant.moved_out_total += 1
        replica.tenant.moved_in_total += 1
        return moved

    async def _keeping_alive(
        self, wait: Coroutine[Any, Any, Slot], client: StreamResponse | None, name: str
    ) -> Slot:
        """Wait for the slot `wait` gives (the paused or lost slot is given back by it); a
        streaming client gets comments meanwhile."""
        waiting = asyncio.create_task(wait, name=name)
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=self._keepalive_s)
                if done:
                    return waiting.result()
                if client is not None:
                    await _write(client, SSE_KEEPALIVE)
        except BaseException:
            waiting.cancel()
            # The cancelled wait leaves no trace in the queue; a slot granted in the meantime
            # is handed on.
            try:
                granted = await waiting
            except asyncio.CancelledError:
                pass
            else:
                granted.release()
            raise

    @staticmethod
    def _account(tenant: TenantState, resumption: Resumption, accounted: _Accounted) -> None:
        """Move the request's token counts onto the tenant's counters (by what changed)."""
        # A restart starts the answer's count again (what it had is discarded): the counter only
        # rises, and ends at what the answer finally had.
        output = max(resumption.generated_tokens, accounted.output)
        tenant.output_tokens_total += output - accounted.output
        recomputed = resumption.recomputed_prompt_tokens
        tenant.recomputed_prompt_tokens_total += recomputed - accounted.recomputed
        discarded = resumption.discarded_output_tokens
        tenant.discarded_output_tokens_total += discarded - accounted.discarded
        accounted.output, accounted.recomputed, accounted.discarded = output, recomputed, discarded


def _push_reads(
    request: Request,
    upstream: EngineResponse,
    resumption: Resumption,
    slot: Slot,
    client: StreamResponse | None,
    first_token: FirstTokenDetector,
    observed: RequestObservation,
) -> PushedReads | None:
    """The attempt's reads relayed from the engine connection's read callback
    (upstream.PushedReads) as the task's loop relays them: a read's events to the client in one
    write, the first token noted. A read goes back to the task unread once a pause was asked
    for (what the engine sent after the last delivered event is never fed: the continuation
    starts from what was) or while the client takes no more; the pushing ends when the
    attempt's [DONE] was fed. None where the task reads (a client stream that is not chunked)."""
    writes = None
    if client is not None:
        writes = ImmediateWrites.of(request, client)
        if writes is None:
            return None

    def take(chunk: bytes) -> bool:
        if slot.pause_requested or (writes is not None and not writes.ready()):
            return False
        out = resumption.relay(chunk)
        if out and writes is not None:
            writes.write(out)
            if not first_token.found and first_token.feed(out):
                observed.first_token()
        return True

    def take_framed(read: bytes) -> bool:
        # The read's chunks' data relayed as a parsed read's is, without the parser and the
        # stream reader. A read that holds [DONE] goes to the parser: the attempt ends there,
        # and `done` is asked only after a parsed read.
        if read.rfind(b"[DONE]") >= 0:
            return False
        if read.count(b"\r\n") == 2:
            # One chunk (its size line's CRLF and its end's), what the engine sends most.
            return take(read[read.index(b"\r\n") + 2 : -2])
        return take(chunks_data(read))

    return PushedReads.start(
        upstream, take, done=lambda: not resumption.in_flight, take_framed=take_framed
    )


async def _open_stream(request: Request, response_headers: CIMultiDict[str]) -> StreamResponse:
    """The client's event stream, its status and headers sent."""
    client = StreamResponse(status=200, headers=response_headers)
    client.content_type = "text/event-stream"
    await client.prepare(request)
    return client


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it (a no-op once done): nothing outlives its request."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and (failure := task.exception()) is not None:
        logger.warning("asking for a resumable prompt's ids failed: %r", failure)


def _text_prompt(path: str, document: Mapping[str, Any]) -> str | None:
    """The prompt of a completion of one text prompt (alone or as a batch of one); None for
    any other request."""
    prompt = document.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if path == COMPLETIONS_PATH and isinstance(prompt, str) else None


def _tracing_only(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace headers among `headers`, for the engine calls that are not the request."""
    return {k: v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}


def _error_response(error: Mapping[str, Any], response_headers: CIMultiDict[str]) -> Response:
    """The engine's mid-stream error event, as a non-streaming client's answer."""
    detail = error.get("error")
    code = detail.get("code") if isinstance(detail, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    headers = CIMultiDict(response_headers)
    headers["Content-Type"] = "application/json"
    return Response(status=status, body=json.dumps(error).encode(), headers=headers)
