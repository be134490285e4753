"""A request's figures, each recorded by one call that feeds every place it is read.

A latency the gateway measures is read in up to three places: the tenant's sliding window, whose
percentiles the control client reports to the control plane (`TenantState.ttft`, `.e2e`), the
gateway's Prometheus histogram (`GatewayMetrics`), and, when `gateway.request_log` is set, the
request's line in the request log (slotshift/request_log.py). The handlers record each figure on
the request's `RequestObservation`, once; nothing else writes any of these sinks. The queue
wait's window is the admission's own (`TenantAdmission.queue_wait`, filled as it grants the
slot), so only its histogram (and the log) is fed here.

A /v1 generation request gets its observation from `RequestFigures.begin` on arrival, and ends
it with `responded` (the handler returned a response) or `failed` (it raised): that is where its
tokens are counted to its tenant (admission_gateway/token_usage.py: the engine's usage, or what a
cut stream delivered) and its log line is written, once per request whatever the path (ordinary
or resumable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from admission_gateway.admission import REJECTION_REASONS, Slot
from admission_gateway.errors import OpenAIError
from admission_gateway.first_token import FirstTokenDetector
from admission_gateway.gateway_state import TenantState
from admission_gateway.metrics import GatewayMetrics
from admission_gateway.token_usage import UsageScanner, ask_for_usage, usage_of_answer
from slotshift.clock import Clock
from slotshift.request_log import (
    SESSION_HEADER,
    Outcome,
    RequestLogWriter,
    RequestRecord,
    SessionHasher,
    TokenSource,
)

_INVALID_CODES = frozenset({"invalid_json", "request_too_large"})
"""The codes of the gateway's own refusals of a body (proxy.py)."""


@dataclass(frozen=True, slots=True)
class RequestLog:
    """Where a gateway's request records go, and what every record of it says."""

    writer: RequestLogWriter
    gateway_id: str
    sessions: SessionHasher | None
    """Hashes the clients' session ids; None: no session is recorded."""


class RequestFigures:
    """Records requests' figures, measured from their arrival on `clock`'s monotonic time."""

    def __init__(self, metrics: GatewayMetrics, clock: Clock, *, count_tokens: bool = True) -> None:
        self._metrics = metrics
        self._clock = clock
        self._log: RequestLog | None = None
        self.count_tokens = count_tokens
        """Count every request's tokens to its tenant (gateway.count_tokens)."""

    def record_to(self, log: RequestLog | None) -> None:
        """Write a record of every request that ends from now on to `log` (None: stop)."""
        self._log = log

    def begin(
        self,
        tenant: TenantState,
        arrived: float,
        *,
        route: str,
        headers: Mapping[str, str],
    ) -> RequestObservation:
        """The observation of a request of `tenant` to `route` that arrived at `arrived` (this
        clock's monotonic time) with `headers`."""
        return RequestObservation(self, tenant, arrived, route=route, headers=headers)

    # -- the sinks, fed by the observations --

    def _queue_wait(self, tenant: TenantState, seconds: float) -> None:
        self._metrics.observe_queue_wait(tenant.pool, tenant.name, seconds)

    def _ttft(self, tenant: TenantState, seconds: float) -> None:
        tenant.ttft.observe(seconds)
        self._metrics.observe_time_to_first_token(tenant.pool, tenant.name, seconds)

    def _e2e(self, tenant: TenantState, seconds: float) -> None:
        tenant.e2e.observe(seconds)
        self._metrics.observe_e2e_latency(tenant.pool, tenant.name, seconds)


class RequestObservation:
    """One generation request's figures, from arrival to end (see the module docstring). The
    relays feed it as the answer passes; what only the log needs (the request's shape) is
    gathered only when a log is on."""

    def __init__(
        self,
        figures: RequestFigures,
        tenant: TenantState,
        arrived: float,
        *,
        route: str,
        headers: Mapping[str, str],
    ) -> None:
        self._figures = figures
        self._clock = figures._clock
        self._log = figures._log
        self.tenant = tenant
        self.arrived = arrived
        """Monotonic arrival time."""
        self._arrived_wall = self._clock.wall()
        self._route = route
        self._session_id = headers.get(SESSION_HEADER) if self._log is not None else None
        self._counting = figures.count_tokens
        self._streamed: bool | None = None
        self._model = ""
        self._max_tokens: int | None = None
        self._queue_wait_s: float | None = None
        self._ttft_s: float | None = None
        self._detector = FirstTokenDetector()
        self._reads_before_first_token = 0
        self._scanner: UsageScanner | None = None
        """Reads a streamed answer's events on their way, when tokens are counted or logged."""
        self._answered = False
        self._engine_prompt_tokens: int | None = None
        self._prompt_tokens: int | None = None
        self._output_tokens: int | None = None
        self._output_from: TokenSource | None = None
        self._pauses = 0
        self._cut: tuple[Outcome, str] | None = None
        self._ended = False

    @property
    def recording(self) -> bool:
        """Whether this request's end is written to a request log."""
        return self._log is not None

    def asked(self, document: Mapping[str, Any], *, model: str = "") -> None:
        """The request's body, parsed: whether it streams, and with a log on its max_tokens and
        its `user`; nothing of its content is kept. Its tokens count under `model` (its pool's
        model, whatever alias it named) or, when that is empty, the model it names (counted only
        once the engine answered, so only names the engine serves become labels)."""
        self._streamed = bool(document.get("stream"))
        named = document.get("model")
        self._model = model or (named if isinstance(named, str) else "")
        if self._streamed and (self._counting or self._log is not None):
            self._scanner = UsageScanner()
        if self._log is None:
            return
        bound = document.get("max_completion_tokens", document.get("max_tokens"))
        if isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0:
            self._max_tokens = bound
        user = document.get("user")
        if self._session_id is None and isinstance(user, str) and user:
            self._session_id = user

    def admitted(self, slot: Slot) -> None:
        """The request got `slot` (its first): its queue wait, into the histogram (the
        admission's window has it already)."""
        self._queue_wait_s = slot.queue_wait_s
        self._figures._queue_wait(self.tenant, slot.queue_wait_s)

    def first_token(self) -> None:
        """The streamed request sent its first generated content now: its time to first token,
        into the window and the histogram."""
        self._ttft_s = self._clock.monotonic() - self.arrived
        self._figures._ttft(self.tenant, self._ttft_s)

    def completed(self) -> None:
        """The request got the last byte of a successful answer now: its end-to-end latency,
        into the window and the histogram."""
        self._figures._e2e(self.tenant, self._clock.monotonic() - self.arrived)

    def prompt_counted(self, tokens: int) -> None:
        """The engine counted the request's prompt before it ran (its /tokenize, or a prompt of
        token ids: admission_gateway/request_cost.py): the prompt count of a stream cut before
        its usage."""
        self._engine_prompt_tokens = tokens

    def upstream_body(self, document: Mapping[str, Any], body: bytes) -> bytes:
        """What to send the engine for the request `document` (parsed from `body`, `asked`
        already): with tokens counted, a stream asks for the engine's usage event, which
        `streamed` then hides from a client who did not ask for it (token_usage.py)."""
        if not (self._counting and self._streamed and self._scanner is not None):
            return body
        asked = ask_for_usage(document, body)
        if asked is None:
            return body
        self._scanner.hide_usage = True
        return asked

    def streamed(self, chunk: bytes) -> bytes:
        """`chunk` of the engine's event stream came (b"": the stream ended): what to relay to
        the client now (token_usage.UsageScanner: whole events, less a hidden usage event).
        The first token, when it completes the first content event."""
        scanner = self._scanner
        if scanner is not None:
            chunk = scanner.feed(chunk) if chunk else scanner.flush()
        if chunk and not self._detector.found:
            self._answered = True
            if self._detector.feed(chunk):
                self.first_token()
            else:
                self._reads_before_first_token += 1
        return chunk

    def streamed_framed(self, read: bytes) -> bool:
        """Whether a read of the engine's stream, as the engine framed it (HTTP chunks of
        whole events), may go to the client as it is: the first token has come, and the
        accounting need not read it (token_usage.UsageScanner.passed); then it is counted as
        `streamed` counts a read. False (nothing counted): give it to `streamed`, unframed."""
        if not self._detector.found:
            return False
        scanner = self._scanner
        return scanner is None or scanner.passed(read)

    def answered(self, status: int, content: bytes) -> None:
        """The engine's whole answer (not streamed) was read: a success completes the request,
        and its `usage` gives the token counts."""
        if status >= 400:
            return
        self.completed()
        self._answered = True
        if self._counting or self._log is not None:
            usage = usage_of_answer(content)
            if usage is not None:
                self._take_usage(*usage)

    def counted(self, *, prompt_tokens: int | None, output_tokens: int, pauses: int) -> None:
        """A resumable request's own counts (admission_gateway/resume.py), from the token ids
        the engine returned: exact across pauses."""
        self._prompt_tokens = prompt_tokens
        self._output_tokens = output_tokens
        self._output_from = "token_ids"
        self._pauses = pauses

    def cut(self, outcome: Outcome, reason: str) -> None:
        """The answer ended early, after its status went out: `outcome` (not completed), with
        `reason`."""
        self._cut = (outcome, reason)

    def cut_by(self, error: OpenAIError) -> None:
        """The answer ended early with the error event of `error` (the engine failed or timed
        out), after its status went out."""
        self.cut(_error_outcome(error, admitted=True), error.code or error.error_type)

    def responded(self, status: int) -> None:
        """The handler returned its response with `status`: the request's end."""
        if self._cut is not None:
            outcome, reason = self._cut
            self._end(outcome, reason, status)
        elif status < 400:
            self._end(Outcome.COMPLETED, None, status)
        else:
            self._end(Outcome.UPSTREAM_ERROR, "engine_error", status)

    def failed(self, exc: BaseException) -> None:
        """The handler raised `exc`: the request's end (an OpenAIError is its answer)."""
        if isinstance(exc, OpenAIError):
            admitted = self._queue_wait_s is not None
            self._end(
                _error_outcome(exc, admitted=admitted), exc.code or exc.error_type, exc.status
            )
        elif isinstance(exc, asyncio.CancelledError):
            self._end(Outcome.CANCELLED, "client_disconnected", None)
        else:
            self._end(Outcome.GATEWAY_ERROR, type(exc).__name__, 500)

    def _take_usage(self, prompt: int, completion: int) -> None:
        self._prompt_tokens = prompt
        self._output_tokens = completion
        self._output_from = "usage"

    def _settle_tokens(self) -> None:
        """The request's token counts, from the best source it had: the resume relay's token ids,
        the engine's usage, else the content events of a stream (token_usage.py: a lower bound)
        with the prompt as the engine counted it before (`prompt_counted`; else none); counted to
        the tenant when the engine answered."""
        scanner = self._scanner
        if self._output_from is None and scanner is not None:
            if scanner.usage is not None:
                self._take_usage(*scanner.usage)
            elif scanner.reads:
                # Less the reads before the first token (chat's role-only opening) and [DONE].
                skipped = self._reads_before_first_token + scanner.done
                self._output_tokens = max(0, scanner.reads - skipped)
                self._prompt_tokens = self._engine_prompt_tokens
                self._output_from = "stream_events"
        # A resumable request is answered once the engine generated for it; one it refused
        # (its prompt known from its token ids all the same) counts nothing.
        resumed = self._output_from == "token_ids" and bool(self._output_tokens)
        if self._counting and (self._answered or resumed):
            self.tenant.count_tokens(
                self._model, self._prompt_tokens or 0, self._output_tokens or 0
            )

    def _end(self, outcome: Outcome, reason: str | None, status: int | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._settle_tokens()
        log = self._log
        if log is None:
            return
        session = None
        if log.sessions is not None and self._session_id:
            session = log.sessions.session(self.tenant.name, self._session_id)
        log.writer.write(
            RequestRecord(
                arrival_unix_s=self._arrived_wall,
                gateway=log.gateway_id,
                pool=self.tenant.pool,
                tenant=self.tenant.name,
                session=session,
                route=self._route,
                streamed=self._streamed,
                max_tokens=self._max_tokens,
                prompt_tokens=self._prompt_tokens,
                output_tokens=self._output_tokens,
                output_tokens_from=self._output_from,
                outcome=outcome,
                reason=reason,
                status=status,
                pauses=self._pauses,
                queue_wait_ms=_ms(self._queue_wait_s),
                ttft_ms=_ms(self._ttft_s),
                e2e_ms=max(0.0, (self._clock.monotonic() - self.arrived) * 1000.0),
            )
        )


def _error_outcome(error: OpenAIError, *, admitted: bool) -> Outcome:
    """How a request that got `error` ended."""
    if error.status == 504:
        return Outcome.TIMED_OUT
    if not admitted and error.code in REJECTION_REASONS:
        return Outcome.REJECTED
    if error.code in _INVALID_CODES:
        return Outcome.INVALID
    if error.error_type == "upstream_error" or (error.code or "").startswith("engine"):
        return Outcome.UPSTREAM_ERROR
    return Outcome.GATEWAY_ERROR


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else max(0.0, seconds * 1000.0)
