"""The services' own sections: the control plane, the admission gateways, the telemetry agent."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slotshift.config.base import ConfigModel, Port, PositiveSeconds
from slotshift.config.tls import ClientTlsConfig, ServerTlsConfig


class ControlPlaneConfig(ConfigModel):
    """The control plane's server and decision loop."""

    grpc_host: str = "127.0.0.1"
    """Address the gRPC server binds."""

    grpc_port: Port = 50051
    """Port of the gRPC API (queries, gateways, telemetry, health, reflection); 0 picks one."""

    metrics_port: Port = 9100
    """Port of the Prometheus /metrics endpoint; 0 picks one."""

    decision_log_size: Annotated[int, Field(ge=1)] = 512
    """Decisions kept per pool for GetDecisions."""

    gateway_lease_ttl_s: PositiveSeconds = 6.0
    """Seconds a disconnected gateway's slots stay counted as in use: it may still be running the
    requests it admitted, so its share is only given to others once the lease has run out."""

    telemetry_stale_after_s: PositiveSeconds = 5.0
    """Telemetry older than this is marked stale in decisions."""

    shutdown_grace_s: PositiveSeconds = 5.0
    """Seconds open streams get to finish when the server stops."""

    push_min_interval_ms: Annotated[float, Field(ge=0)] = 100.0
    """Most one allocation update a gateway gets in this long for changes that can wait: parts of
    an idle tenant's headroom moving between gateways. An update that takes slots away (a shrink,
    a pause) or raises the limit of a tenant with requests queued there goes out at once; the one
    that follows a held change carries the newest limits. 0: every change at once."""

    reconcile_min_interval_ms: Annotated[float, Field(ge=0)] = 10.0
    """Most one re-grant of a pool in this long: reports and acknowledgements arriving together
    are taken in one pass over the pool's cells (which costs about a millisecond per 100,000
    cells) instead of one pass each. A lent slot waits at most this long more to come back."""

    tls: ServerTlsConfig | None = None
    """TLS on the gRPC API (gateways, agents, grpcurl), mutual with require_client_cert; unset:
    plaintext. The gateways' and the agent's controlplane_tls must then be set to match."""

    admin_token_file: str | None = None
    """A file holding the admin token (its first line), such as a mounted Kubernetes Secret: the
    admin API's changes (AdminService, all but GetPoolConfig) need `authorization: Bearer TOKEN`.
    A relative path is relative to the config file's folder. Unset: the admin API refuses every
    change."""


class RequestLogConfig(ConfigModel):
    """A gateway's request log (slotshift/request_log.py): one JSON line per finished request,
    for replaying the traffic (`slotshift_tools/replay.py`). What is recorded and what never is:
    docs/operations.md."""

    log_file: Annotated[str, Field(min_length=1)]
    """The file written (appended to across restarts; relative to the config file's folder).
    `{gateway_id}` in it is replaced by the gateway's id, so that replicas that read this one
    section write files of their own: two gateways must never share a file."""

    max_bytes_per_file: Annotated[int, Field(ge=4096)] = 64 * 1024 * 1024
    """A file is rotated (`log_file` becomes `log_file.1`, `.1` becomes `.2`, ...) before a line
    would take it past this many bytes. A record is about 400 bytes."""

    files_kept: Annotated[int, Field(ge=1)] = 5
    """Rotated files kept besides the one written; the oldest beyond them is deleted."""

    flush_interval_ms: Annotated[float, Field(gt=0)] = 1000.0
    """Records are buffered in memory and written by a background thread this often (sooner
    when 256 KiB are waiting): the data path never waits on the disk. A crash loses at most
    this much of the log."""

    max_buffered_records: Annotated[int, Field(ge=1)] = 100_000
    """Records held while the disk is slow; beyond this, new records are dropped (counted and
    logged) rather than slow the requests down."""

    session_key_file: str | None = None
    """A file whose first line is the key (at least 16 bytes) of the HMAC-SHA-256 that hashes
    the clients' session ids (the `X-Session-Id` header, else the body's `user`), such as a
    mounted Kubernetes Secret; give every gateway the same key so that a session is recognised
    across them. Unset: no session is recorded (an unkeyed hash of a user name could be
    reversed by hashing guesses)."""


class GatewayConfig(ConfigModel):
    """The admission gateways (every replica reads the same section)."""

    host: str = "127.0.0.1"
    """Address the HTTP server binds."""

    port: Port = 8080
    """Port of the OpenAI-compatible API and /metrics; 0 picks one."""

    pool: str = "default"
    """The pool this gateway serves."""

    controlplane_target: str = "127.0.0.1:50051"
    """host:port of the control plane's gRPC API."""

    controlplane_tls: ClientTlsConfig | None = None
    """TLS on the stream to the control plane (set when controlplane.tls is), with a client
    certificate for mutual TLS; unset: plaintext."""

    tls: ServerTlsConfig | None = None
    """HTTPS on the gateway's HTTP server (the OpenAI API, /metrics, /ready), mutual with
    require_client_cert; unset: plain HTTP."""

    queue_max_depth: Annotated[int, Field(ge=0)] = 1024
    """Requests a tenant may have waiting at one gateway; beyond that it gets 429."""

    queue_timeout_s: PositiveSeconds = 60.0
    """Seconds a request may wait for a slot before it gets 503 (see docs/architecture.md)."""

    report_interval_s: PositiveSeconds = 0.25
    """Seconds between two demand reports to the control plane."""

    full_report_interval_s: PositiveSeconds = 5.0
    """Reports and acknowledgements name only the tenants whose figures changed since the last
    ones on the stream; every this many seconds one names every tenant, so that nothing the
    control plane holds can drift."""

    queue_report_min_interval_s: PositiveSeconds = 0.02
    """When a tenant's requests start to queue, the gateway reports at once rather than at the
    next report_interval_s, so that the control plane can re-split the tenant's limit among the
    gateways (or take a fast-path decision) while the request waits; at most one report per this
    many seconds (at most report_interval_s), however many queues start."""

    on_controlplane_loss: Literal["keep", "fallback"] = "keep"
    """What a gateway enforces when its stream to the control plane breaks: `keep` the last
    allocation it applied (fail-static), or `fallback`: each tenant's limit becomes the smaller of
    that and its static fallback split, so that the gateway never holds more than its static
    share while nobody coordinates it (more conservative; lent slots are not used meanwhile)."""

    fallback_replicas: Annotated[int, Field(ge=1)] = 2
    """Replicas the static fallback split assumes: before it first hears from the control plane,
    each gateway admits up to the tenant's nominal share divided by this, so that that many
    replicas together stay within the budget."""

    reconnect_initial_s: PositiveSeconds = 0.2
    """First delay before reconnecting to the control plane; doubles up to reconnect_max_s."""

    reconnect_max_s: PositiveSeconds = 1.0
    """Longest delay between two reconnection attempts. Short, so that a restarted control plane
    hears from everyone within two decision periods; one attempt a second costs nothing."""

    upstream_timeout_s: PositiveSeconds = 600.0
    """Longest an upstream request may take, from admission to its last byte."""

    upstream_keepalive_timeout_s: PositiveSeconds = 4.0
    """Seconds an idle connection to the engine stays in the gateway's pool for reuse. Keep it
    below the engine's own idle timeout (vLLM's `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s by default):
    a connection the engine closes while the gateway reuses it fails the request on it (the
    gateway then retries it once, see admission_gateway/upstream.py)."""

    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    """Largest request body accepted."""

    drain_timeout_s: PositiveSeconds = 30.0
    """Seconds running requests get to finish on shutdown."""

    paused_keepalive_interval_s: PositiveSeconds = 5.0
    """While a streamed request is paused, an SSE comment is sent this often so that idle
    proxies between the client and the gateway do not cut the stream."""

    retry_after_s: Annotated[int, Field(ge=0)] = 1
    """Seconds a client is told to wait (Retry-After) with a 429 (queue full) or a 503 (queue
    timeout, shutting down)."""

    latency_window_s: PositiveSeconds = 60.0
    """Age of the oldest request counted in the reported latency percentiles (TTFT, end-to-end,
    queue wait): the control plane judges how tenants are served now, not since start-up."""

    latency_window_samples: Annotated[int, Field(ge=1)] = 1024
    """Most requests per tenant and latency kind kept for the percentiles (bounds memory)."""

    request_log: RequestLogConfig | None = None
    """Record one line per finished request (never prompts, outputs or keys); unset: no log."""


class AgentConfig(ConfigModel):
    """The telemetry agent on the GPU node."""

    pool: str = "default"
    """The pool whose engine this agent watches."""

    agent_id: str = ""
    """This agent's name in reports; empty means the host name."""

    controlplane_target: str = "127.0.0.1:50051"
    """host:port of the control plane's gRPC API."""

    controlplane_tls: ClientTlsConfig | None = None
    """TLS on the telemetry stream to the control plane (set when controlplane.tls is), with a
    client certificate for mutual TLS; unset: plaintext."""

    engine_metrics_url: str = "http://127.0.0.1:8000/metrics"
    """vLLM's Prometheus endpoint."""

    interval_s: PositiveSeconds = 1.0
    """Seconds between two reports."""

    scrape_timeout_s: PositiveSeconds = 2.0
    """Longest a scrape of the engine's /metrics may take."""

    reconnect_initial_s: PositiveSeconds = 0.2
    """First delay before reconnecting to the control plane; doubles up to reconnect_max_s."""

    reconnect_max_s: PositiveSeconds = 1.0
    """Longest delay between two reconnection attempts. Short, so that a restarted control plane
    hears from everyone within two decision periods; one attempt a second costs nothing."""

    metrics_port: Port = 9101
    """Port of the agent's own Prometheus /metrics endpoint; 0 picks one."""

    host: str = "127.0.0.1"
    """Address the agent's /metrics endpoint binds."""
