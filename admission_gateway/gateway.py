"""One admission gateway in-process: HTTP server, shared upstream session, control stream.

Tests start it on port 0 and read its state; `main.run` starts it for the CLI.

Shutdown, in order: /ready turns 503 and new requests get 503 (the listener stays open meanwhile,
so load balancers see "not ready" rather than refused connections); queued requests get 503;
running requests get up to drain_timeout_s to finish; then the HTTP server closes, the request
log (when gateway.request_log is set) writes its last records and closes, the control stream
closes (it reports the draining gateway's usage until then) and the upstream session is closed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import socket
import ssl
from collections.abc import Mapping, Sequence
from contextvars import Token
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util.types import Attributes
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import SecretStr

from admission_gateway.admission import TenantAdmission
from admission_gateway.auth import Authenticator
from admission_gateway.control_client import ControlClient
from admission_gateway.errors import server_error
from admission_gateway.figures import RequestLog
from admission_gateway.gateway_state import GatewayState
from admission_gateway.http_server import HttpServer, Request, Response, get, json_response
from admission_gateway.metrics import GatewayMetrics
from admission_gateway.proxy import OpenAIProxy, PoolEndpoint
from admission_gateway.upstream import EngineClient
from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock, SystemClock
from slotshift.config import (
    ConfigError,
    PoolConfig,
    RequestLogConfig,
    SlotshiftConfig,
    key_digester,
    read_secret_text,
    read_secret_tokens,
    reveal,
)
from slotshift.keys import bearer_matches
from slotshift.metrics_guard import (
    METRICS_UNAUTHORIZED_BODY,
    METRICS_UNAUTHORIZED_HEADERS,
    metrics_token_digest,
)
from slotshift.request_log import RequestLogWriter, SessionHasher, session_key_from_text
from slotshift.stream_token import read_stream_token
from slotshift.tls import (
    ChannelSecurity,
    client_ssl_context,
    load_channel_security,
    server_ssl_context,
)

logger = logging.getLogger(__name__)

# Once the drain is over, what is left are responses finishing their last write (the slot is
# released just before) and slot-less requests; the server gives them this long twice (to finish,
# then to unwind after cancellation) before it drops their connections.
_SERVER_SHUTDOWN_TIMEOUT_S = 0.25


class AdmissionGateway:
    """An admission gateway for the pools of `config.gateway.pools` (or the one of
    `config.gateway.pool`): one control stream and one engine client per pool, one HTTP server
    and one set of keys for all (a tenant is one name and one key across the pools it is in).

    tracer_provider: where its spans go (requests, allocations applied); no-op by default.
    """

    def __init__(
        self,
        config: SlotshiftConfig,
        *,
        gateway_id: str | None = None,
        port: int | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self._settings = config.gateway
        provider = tracer_provider if tracer_provider is not None else trace.NoOpTracerProvider()
        self._tracer: trace.Tracer = (
            _UntracedTracer()
            if isinstance(provider, trace.NoOpTracerProvider)
            else provider.get_tracer("slotshift.admission_gateway")
        )
        try:
            self._pools = config.fronted_pools()
        except KeyError:
            raise ConfigError(f"gateway.pool: no pool named {self._settings.pool!r}") from None
        self._clock = clock if clock is not None else SystemClock()
        self._rng = rng
        self._requested_port = self._settings.port if port is None else port
        self._requested_gateway_id = gateway_id
        self.states = {
            pool.name: GatewayState(pool, self._settings, self._clock) for pool in self._pools
        }
        """pool -> per-tenant admission, limits and the allocation version in force there."""
        self.state = self.states[self._pools[0].name]
        """The first pool's state (the only one of a gateway fronting one pool)."""
        self.metrics = GatewayMetrics(*self.states.values())
        self._keyed_by = config.tenant_keys
        self._authenticator = Authenticator(
            (
                (reveal(key), tenant.name)
                for pool in self._pools
                for tenant in pool.tenants
                for key in tenant.api_keys
            ),
            digester=key_digester(config.tenant_keys),
        )
        self._directories: dict[str, Mapping[str, tuple[bytes, ...]]] = {}
        """pool -> the tenants the control plane runs there, with their key digests."""
        self._tasks = Supervisor("admission-gateway")
        self._http: HttpServer | None = None
        self._engines: list[EngineClient] = []
        self._proxy: OpenAIProxy | None = None
        self._port: int | None = None
        self._gateway_id: str | None = None
        self.control_clients: dict[str, ControlClient] = {}
        """pool -> its stream to the control plane (set by start)."""
        self.request_log: RequestLogWriter | None = None
        """The request log's writer (set by start when gateway.request_log is set)."""
        self._stopped = False
        self._metrics_token: bytes | None = None
        """The digest of the token /metrics asks for (gateway.metrics_token_file); None: open."""

    @property
    def port(self) -> int:
        """The port the HTTP server listens on (known once started)."""
        if self._port is None:
            raise RuntimeError("the gateway has not started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL of the gateway, e.g. http://127.0.0.1:8080 (the OpenAI API is under /v1);
        https when gateway.tls is set."""
        scheme = "http" if self._settings.tls is None else "https"
        return f"{scheme}://{self._settings.host}:{self.port}"

    @property
    def gateway_id(self) -> str:
        """This gateway's name towards the control plane (default: host name and port)."""
        if self._gateway_id is None:
            raise RuntimeError("the gateway has not started")
        return self._gateway_id

    @property
    def ready(self) -> bool:
        """True while serving; False once draining."""
        return self._proxy is not None and self._proxy.accepting

    @property
    def control_client(self) -> ControlClient | None:
        """The first pool's stream to the control plane (None before start)."""
        return self.control_clients.get(self._pools[0].name)

    def admission(self, tenant: str, pool: str | None = None) -> TenantAdmission:
        """The admission of `tenant` at this gateway, in `pool` (default: the first pool)."""
        state = self.state if pool is None else self.states[pool]
        return state.tenants[tenant].admission

    async def start(self) -> None:
        """Bind the HTTP server, open the upstream session and start the control stream."""
        if not self._authenticator.digester.is_keyed:
            logger.warning(
                "tenants' API keys are digested unkeyed (SHA-256): %s",
                "tenant_keys.unkeyed_key_digests is set"
                if self._keyed_by.unkeyed_key_digests
                else "this config, built in code, sets no key-digest secret",
            )
        ssl_context, security, engine_ssl = await asyncio.to_thread(self._load_tls)
        token_file = self._settings.metrics_token_file
        if token_file is not None:
            self._metrics_token = await asyncio.to_thread(
                metrics_token_digest, token_file, "gateway.metrics_token_file"
            )
        engine_keys = await asyncio.to_thread(self._load_engine_keys)
        stream_token = await asyncio.to_thread(
            read_stream_token,
            self._settings.controlplane_token_file,
            field="gateway.controlplane_token_file",
        )
        log_settings = self._settings.request_log
        sessions = None
        if log_settings is not None and log_settings.session_key_file is not None:
            sessions = await asyncio.to_thread(_session_hasher, log_settings.session_key_file)
        endpoints = []
        for pool in self._pools:
            engine = EngineClient(
                engine_ssl=engine_ssl[pool.name],
                keepalive_timeout_s=self._settings.upstream_keepalive_timeout_s,
                api_key=engine_keys[pool.name],
                clock=self._clock,
            )
            self._engines.append(engine)
            endpoints.append(
                PoolEndpoint(
                    state=self.states[pool.name],
                    engine=engine,
                    engine_url=pool.engine_url,
                    models=tuple(pool.models),
                    preemption_enabled=pool.preemption.enabled,
                    request_cost=pool.request_cost,
                )
            )
        self._proxy = OpenAIProxy(
            pools=endpoints,
            authenticator=self._authenticator,
            upstream_timeout_s=self._settings.upstream_timeout_s,
            max_body_bytes=self._settings.max_body_bytes,
            retry_after_s=self._settings.retry_after_s,
            metrics=self.metrics,
            clock=self._clock,
            tracer=self._tracer,
            paused_keepalive_interval_s=self._settings.paused_keepalive_interval_s,
            replica_down_s=self._settings.replica_down_s,
            count_tokens=self._settings.count_tokens,
        )
        # A client that disconnects cancels its handler (http_server.py), which aborts the
        # upstream request and releases the slot at once.
        self._http = HttpServer(
            [
                *self._proxy.routes(),
                get("/health", self._health),
                get("/ready", self._ready),
                get("/metrics", self._metrics),
            ],
            server_error,
        )
        try:
            self._port = await self._http.start(
                self._settings.host, self._requested_port, ssl_context
            )
        except BaseException:
            # e.g. the port is taken: leave nothing open behind.
            await self._http.close(_SERVER_SHUTDOWN_TIMEOUT_S)
            await self._close_engines()
            raise
        self._gateway_id = self._requested_gateway_id or f"{socket.gethostname()}:{self._port}"
        # Nothing has been awaited since the listener opened, so no request has run without it
        # (nor without the request log: its records wait in memory until the file is open).
        self._proxy.gateway_id = self._gateway_id
        if log_settings is not None:
            self.request_log = _request_log_writer(log_settings, self._gateway_id)
            self._proxy.figures.record_to(RequestLog(self.request_log, self._gateway_id, sessions))
            try:
                await self.request_log.open()
            except OSError as exc:
                await self._http.close(_SERVER_SHUTDOWN_TIMEOUT_S)
                await self.request_log.close()
                await self._close_engines()
                raise ConfigError(
                    f"gateway.request_log.log_file: cannot write {self.request_log.path}: {exc}"
                ) from exc
            self._tasks.spawn("request-log", self.request_log.run())
        for pool in self._pools:
            client = ControlClient(
                self.states[pool.name],
                target=self._settings.controlplane_target,
                gateway_id=self._gateway_id,
                report_interval_s=self._settings.report_interval_s,
                queue_report_min_interval_s=self._settings.queue_report_min_interval_s,
                full_report_interval_s=self._settings.full_report_interval_s,
                reconnect_initial_s=self._settings.reconnect_initial_s,
                reconnect_max_s=self._settings.reconnect_max_s,
                clock=self._clock,
                rng=self._rng,
                tracer=self._tracer,
                security=security,
                token=stream_token,
                on_tenants=functools.partial(self._use_tenants, pool),
            )
            self.control_clients[pool.name] = client
            self._tasks.spawn(f"control-stream[{pool.name}]", client.run())

    def _use_tenants(self, pool: PoolConfig, tenants: Mapping[str, tuple[bytes, ...]]) -> None:
        """Authenticate exactly the tenants the control plane runs in the fronted pools (the
        admin API adds and removes them) by exactly the keys it sent (the admin API adds and
        revokes keys, a config key among them): the digests it sent for `pool` and what it sent
        for the others; a pool whose directory has not come yet, by our own config's keys."""
        directories = {**self._directories, pool.name: tenants}
        digests = [
            (digest, tenant)
            for directory in directories.values()
            for tenant, ds in directory.items()
            for digest in ds
        ]
        # A pool whose directory has not come yet runs the tenants of our config, with their
        # keys; once it has, the control plane's digests alone say who is who (a revoked
        # config key must stop working).
        digester = self._authenticator.digester
        directed = {tenant for directory in directories.values() for tenant in directory}
        digests += [
            (digester.digest(reveal(key)), t.name)
            for fronted in self._pools
            if fronted.name not in directories
            for t in fronted.tenants
            if t.name not in directed
            for key in t.api_keys
        ]
        try:
            self._authenticator.replace_digests(digests)
        except ValueError as exc:
            logger.error("keeping the tenants' keys as they were: %s", exc)
            return
        self._directories = directories

    def _load_tls(
        self,
    ) -> tuple[ssl.SSLContext | None, ChannelSecurity | None, dict[str, ssl.SSLContext | bool]]:
        """The HTTPS context of the API, the credentials of the control stream (None where the
        config leaves them plaintext) and, per pool, how to check an https engine (True: the
        system's roots). Blocks: reads the PEM files."""
        tls = self._settings.tls
        ssl_context = None if tls is None else server_ssl_context(tls)
        engine_ssl: dict[str, ssl.SSLContext | bool] = {
            pool.name: True if pool.engine_tls is None else client_ssl_context(pool.engine_tls)
            for pool in self._pools
        }
        return ssl_context, load_channel_security(self._settings.controlplane_tls), engine_ssl

    def _load_engine_keys(self) -> dict[str, SecretStr | None]:
        """Per pool, the engine's API key (the first token of engine_api_key_file), or None
        where the pool sets none. Blocks: reads the files; ConfigError names the pool."""
        keys: dict[str, SecretStr | None] = {}
        for pool in self._pools:
            path = pool.engine_api_key_file
            if path is None:
                keys[pool.name] = None
                continue
            field = f"pool {pool.name}: engine_api_key_file"
            keys[pool.name] = SecretStr(read_secret_tokens(path, field=field)[0])
        return keys

    async def _close_engines(self) -> None:
        for engine in self._engines:
            await engine.close()

    async def stop(self) -> None:
        """Drain and shut down (see the module docstring for the order); safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        if self._proxy is not None:
            self._proxy.accepting = False
        for state in self.states.values():
            state.close()
        try:
            async with asyncio.timeout(self._settings.drain_timeout_s):
                for state in self.states.values():
                    await state.wait_idle()
        except TimeoutError:
            running = sum(
                t.admission.in_flight_requests
                for state in self.states.values()
                for t in state.tenants.values()
            )
            logger.warning(
                "%d requests still running after %.1f s of draining; cutting them off",
                running,
                self._settings.drain_timeout_s,
            )
        if self._http is not None:
            await self._http.close(_SERVER_SHUTDOWN_TIMEOUT_S)
        if self.request_log is not None:
            # Every request has ended (the server is closed): its record is in the buffer.
            await self.request_log.close()
        await self._tasks.stop()
        await self._close_engines()

    async def _health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def _ready(self, request: Request) -> Response:
        if self.ready:
            return json_response({"status": "ready"})
        return json_response({"status": "draining"}, status=503)

    async def _metrics(self, request: Request) -> Response:
        if self._metrics_token is not None and not bearer_matches(
            request.headers.get("Authorization"), self._metrics_token
        ):
            return json_response(
                METRICS_UNAUTHORIZED_BODY, status=401, headers=METRICS_UNAUTHORIZED_HEADERS
            )
        return Response(
            body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


def _session_hasher(path: str) -> SessionHasher:
    """The hasher of the key in `path`. Blocks: reads the file."""
    field = "gateway.request_log.session_key_file"
    try:
        return SessionHasher(session_key_from_text(read_secret_text(path, field=field)))
    except ValueError as exc:
        # ConfigError is a ValueError: a file that cannot be read says so already.
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{field}: {path}: {exc}") from None


def _request_log_writer(settings: RequestLogConfig, gateway_id: str) -> RequestLogWriter:
    """The writer of this gateway's file: `{gateway_id}` in the path becomes the id, with any
    character that is no use in a file name (`/`, `:`) replaced by `_`."""
    safe_id = "".join(c if c.isalnum() or c in "._-" else "_" for c in gateway_id)
    return RequestLogWriter(
        Path(settings.log_file.replace("{gateway_id}", safe_id)),
        max_bytes_per_file=settings.max_bytes_per_file,
        files_kept=settings.files_kept,
        flush_interval_s=settings.flush_interval_ms / 1000.0,
        max_buffered_records=settings.max_buffered_records,
    )


class _UntracedTracer(trace.NoOpTracer):
    """The no-op tracer (no span is recorded; a client's trace context still reaches the
    engine, as the current span), with the current span set by a plain context manager: the
    API's generator-based ones cost a relayed request a tenth of its instructions, for its
    four spans."""

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _CurrentSpan:
        # What NoOpTracer's does: its span (the parent's, non-recording) is current inside;
        # a non-recording span records no exception, no status, and has no end to mark.
        if context is None:
            current = trace.get_current_span()
            if isinstance(current, trace.NonRecordingSpan):
                # The child of a non-recording span is that span, current already.
                return _CurrentSpan(current, current=True)
        return _CurrentSpan(self.start_span(name, context))


class _CurrentSpan:
    """`span` as the current span while inside (what `trace.use_span` does for a span that
    does not record)."""

    __slots__ = ("_current", "_span", "_token")

    def __init__(self, span: trace.Span, *, current: bool = False) -> None:
        self._span = span
        self._current = current
        self._token: Token[Context] | None = None

    def __enter__(self) -> trace.Span:
        # A span that is current already (a child of a non-recording span is that span) is
        # not set again: the context would be the same.
        if not self._current and self._span is not trace.get_current_span():
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            otel_context.detach(self._token)
