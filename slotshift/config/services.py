"""The services' own sections: the control plane, the admission gateways, the telemetry agent."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Annotated, Literal

from pydantic import Field, model_validator

from slotshift.config.base import ConfigModel, Name, Port, PositiveSeconds
from slotshift.config.state_store import StateStoreConfig
from slotshift.config.stream_auth import StreamAuthConfig
from slotshift.config.tls import ClientTlsConfig, ServerTlsConfig

ControlPlaneTarget = str | Annotated[list[str], Field(min_length=1)]
"""Where a gateway or an agent finds the control plane: one host:port, or one per replica."""


class ReplicaLossConfig(ConfigModel):
    """When the control plane takes a replica group's member for lost, and for back
    (docs/operations.md, "Replica groups"): the signal is the member's telemetry (its agent's
    latest report says the engine could not be scraped, or its reports went silent); a lost
    member's floor and ceiling slots are divided over the live members until it is back."""

    lost_after_s: Annotated[float, Field(ge=0)] = 2.0
    """Seconds the signal must say down, at every check, before the member is taken for lost:
    one failed scrape (the agent reports every agent.interval_s) does not move the slots, a
    dead engine does within about interval_s + this + check_interval_s."""

    back_after_s: Annotated[float, Field(ge=0)] = 5.0
    """Seconds the signal must say up, at every check, before a lost member is back and the
    group's division restored: longer than lost_after_s, so that an engine that flaps is taken
    back only once it has stayed up."""

    silent_after_s: PositiveSeconds = 3.0
    """A member whose agent's latest report is older than this counts as down (its agent, or
    its node, gone): three reports missed at the agent's default interval of 1 s. A member
    never heard from since the control plane started never counts as down."""

    check_interval_s: PositiveSeconds = 0.5
    """Seconds between two looks at every member's signal."""


class ControlPlaneConfig(ConfigModel):
    """The control plane's server and decision loop."""

    grpc_host: str = "127.0.0.1"
    """Address the gRPC server binds."""

    grpc_port: Port = 50051
    """Port of the gRPC API (queries, gateways, telemetry, health, reflection); 0 picks one."""

    metrics_port: Port = 9100
    """Port of the Prometheus /metrics endpoint; 0 picks one."""

    metrics_token_file: str | None = None
    """A file holding the bearer token `/metrics` asks for (Prometheus:
    `authorization.credentials_file`), read at start; unset: `/metrics` answers anyone (it holds
    tenant names and counts, no keys). Relative to the config file's folder."""

    decision_log_size: Annotated[int, Field(ge=1)] = 512
    """Decisions kept per pool for GetDecisions."""

    gateway_lease_ttl_s: PositiveSeconds = 6.0
    """Seconds a disconnected gateway's slots stay counted as in use: it may still be running the
    requests it admitted, so its share is only given to others once the lease has run out."""

    telemetry_stale_after_s: PositiveSeconds = 5.0
    """Telemetry older than this is marked stale in decisions."""

    replica_loss: ReplicaLossConfig = Field(default_factory=ReplicaLossConfig)
    """When a replica group's member is taken for lost and its slot figures go to the live
    members, and when it is back."""

    shutdown_grace_s: PositiveSeconds = 5.0
    """Seconds open streams get to finish when the server stops."""

    push_min_interval_ms: Annotated[float, Field(ge=0)] = 100.0
    """About one allocation update a gateway gets in this long. An update somebody waits for
    goes out at once (a pause, a decision's change of a tenant's pool-wide limit, a grant to a
    lender queued there, any shrink while a lender waits for slots held elsewhere) and takes the
    next slot; one that can wait (headroom moving between gateways) waits for the gateway's next
    slot and then carries the newest limits (controlplane/core/push.py). 0: every change at
    once."""

    reconcile_min_interval_ms: Annotated[float, Field(ge=0)] = 10.0
    """Most one re-grant of a pool in this long: reports and acknowledgements arriving together
    are taken in one pass over the pool's cells (which costs about a millisecond per 100,000
    cells) instead of one pass each. A lent slot waits at most this long more to come back."""

    reconcile_max_cores: Annotated[float, Field(gt=0, le=1)] = 0.1
    """Most of one CPU core a pool's re-grants keep busy: after a pass that took d seconds the
    next waits at least d / this minus d (and at least reconcile_min_interval_ms), so that a
    large pool re-grants less often rather than taking the process's core (a 100,000-cell pass
    of 2 ms: at most 50 a second). A pool whose pass is quicker than a tenth of
    reconcile_min_interval_ms is paced by that alone."""

    config_reload_interval_s: Annotated[float, Field(ge=0)] = 10.0
    """Seconds between two looks at the config file (its content and that of the key files it
    names, hashed: a Kubernetes ConfigMap mount changes by a symlink swap, which no modification
    time shows); a change reloads it as SIGHUP does (docs/operations.md, "Reload the config
    file"). 0: only SIGHUP reloads. 10 s is small beside the minute or so a kubelet takes to
    update a mounted ConfigMap, and a look costs one read and hash of a few small files."""

    tls: ServerTlsConfig | None = None
    """TLS on the gRPC API (gateways, agents, grpcurl), mutual with require_client_cert; unset:
    plaintext. The gateways' and the agent's controlplane_tls must then be set to match."""

    admin_token_file: str | None = None
    """A file holding the admin token (its first line), such as a mounted Kubernetes Secret: the
    admin API's changes (AdminService, all but GetPoolConfig) need `authorization: Bearer TOKEN`.
    A relative path is relative to the config file's folder. Unset: the admin API refuses every
    change."""

    query_token_file: str | None = None
    """A file of the tokens the read-only gRPC calls accept (every AllocationService query, and
    AdminService.GetPoolConfig), one per line (blank lines and `#` comments skipped; two during
    a rotation), such as a mounted Kubernetes Secret: those calls then need `authorization:
    Bearer TOKEN` with one of them or the admin token (an admin may read), else UNAUTHENTICATED.
    gRPC health and reflection stay open (probes, `grpcurl list`). Relative to the config
    file's folder. Unset: the queries answer anyone who reaches the gRPC port, and tell them the
    pools, tenant names, limits, demand and queues, tenant settings, decision reasons and key
    ids (never a key, nor a key's digest)."""

    replica_id: str = ""
    """This replica's name in the leader lease (controlplane/leadership.py): unique among the
    replicas sharing a state store, and the same across restarts of one replica (a replica
    restarted under its name takes its lease back at once, a new epoch). Empty: the host name
    (a Kubernetes pod's name)."""

    leader_lease_ttl_s: PositiveSeconds = 5.0
    """Seconds the leader's lease lasts unrenewed: the takeover time. The leader renews it
    every third of this; one that could not stops publishing and drops its streams before it
    runs out; a follower takes it over at most this long after the leader's last renewal (a
    leader that stops in order hands over at once). Gateways then reach the new leader within
    their reconnect_max_s."""

    state_store: StateStoreConfig = Field(default_factory=StateStoreConfig)
    """What survives a restart (admin changes, the version counters, the decision history) and
    where: a SQLite file by default, PostgreSQL for several replicas."""

    stream_auth: StreamAuthConfig = Field(default_factory=StreamAuthConfig)
    """Who may open the gateways' and the agents' streams: a token per role, and optionally the
    mutual-TLS identities allowed per role and pool. Unset, the control plane refuses to start
    (stream_auth.insecure_allow_unauthenticated says what opening them would mean)."""

    @model_validator(mode="after")
    def _identities_need_client_certs(self) -> ControlPlaneConfig:
        auth = self.stream_auth
        if auth.gateway_identities is None and auth.agent_identities is None:
            return self
        if self.tls is None or not self.tls.require_client_cert:
            raise ValueError(
                "stream_auth: gateway_identities and agent_identities are client-certificate "
                "identities: they need tls with require_client_cert (mutual TLS)"
            )
        return self


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

    metrics_token_file: str | None = None
    """A file holding the bearer token `/metrics` asks for (Prometheus:
    `authorization.credentials_file`), read at start; unset: `/metrics` answers anyone (it holds
    tenant names and counts, no keys). Relative to the config file's folder."""

    pool: str = "default"
    """The pool this gateway fronts, when `pools` is empty."""

    pools: list[str] = Field(default_factory=list)
    """The pools this gateway fronts (every replica reads the same section): each request goes
    to a pool that serves its `model` (each pool lists its models). Empty: `pool` alone."""

    replica_down_s: PositiveSeconds = 2.0
    """Seconds a pool whose engine could not be reached (no connection) is passed over while
    another pool serves the request's model; then it is tried again."""

    controlplane_target: ControlPlaneTarget = "127.0.0.1:50051"
    """host:port of the control plane's gRPC API; or a list, one per control-plane replica:
    the stream goes to the leader, found by asking each in turn through gRPC health whether it
    serves GatewayService (followers say NOT_SERVING), and moves on when it stops serving."""

    controlplane_tls: ClientTlsConfig | None = None
    """TLS on the stream to the control plane (set when controlplane.tls is), with a client
    certificate for mutual TLS; unset: plaintext."""

    controlplane_token_file: str | None = None
    """A file whose first token (one per line; blank lines and `#` comments skipped) the gateway
    presents on its stream to the control plane (`authorization: Bearer TOKEN`): one of the
    control plane's `stream_auth.gateway_token_file`. Read at start; relative to the config
    file's folder. Unset: no token is sent (the control plane then refuses the stream unless it
    checks gateways by their client certificate alone)."""

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

    count_tokens: bool = True
    """Count every tenant's prompt and completion tokens from the engine's `usage` (metrics, the
    full reports to the control plane, the request log): a streamed request is sent upstream with
    `stream_options.include_usage`, and the usage event is taken out of the stream of a client
    that did not ask for it (docs/operations.md, "Tokens per tenant"). False: bodies go upstream
    as sent and nothing is counted but what the request log reads from the streams."""


GpuIndex = Annotated[int, Field(ge=0)]
"""A GPU by its NVML index: 0, 1, ... in NVML's order, which is PCI bus order (`nvidia-smi`'s),
not necessarily CUDA's default order (`CUDA_DEVICE_ORDER=FASTEST_FIRST`)."""

GpuUuid = Annotated[str, Field(pattern=r"^GPU-[0-9A-Fa-f-]{8,}$")]
"""A GPU by its NVML UUID, as `nvidia-smi -L` prints it (`GPU-5b3a9c1e-...`): stable across
reboots and re-enumeration, unlike an index. MIG instances (`MIG-...`) are not read."""

GpuSelector = GpuIndex | GpuUuid
"""One GPU of an engine: an index or a UUID."""

DEFAULT_AGENT_POOL = "default"
"""The pool of the one engine of the one-engine shorthand when `agent.pool` is unset."""

DEFAULT_ENGINE_METRICS_URL = "http://127.0.0.1:8000/metrics"
"""The /metrics of the one engine of the one-engine shorthand when `agent.engine_metrics_url` is
unset: vLLM on its default port on the agent's host."""


class AgentEngineConfig(ConfigModel):
    """One engine the agent watches: the pool it is, its /metrics, and the GPUs it runs on."""

    pool: Name
    """The pool whose engine this is: every report of this engine names it, and carries this
    engine's figures and its GPUs' only."""

    metrics_url: Annotated[str, Field(pattern=r"^https?://")]
    """The engine's Prometheus endpoint (vLLM's /metrics), scraped every interval_s."""

    metrics_tls: ClientTlsConfig | None = None
    """How the agent checks an https metrics_url (vLLM's --ssl-certfile), with a client
    certificate if the engine requires one; unset: the system's roots for https."""

    gpus: list[GpuSelector] | None = None
    """The engine's GPUs, each by NVML index or UUID (prefer UUIDs: an index names another GPU
    when one is removed). Unset, with gpus_file unset too: every GPU NVML shows, which only an
    agent watching one engine may do (validation refuses it for several). Empty: the engine has
    no GPU of its own (a CPU engine, the emulator), and its report carries no NVML figures."""

    gpus_file: str | None = None
    """Instead of gpus: a file naming the engine's GPUs, one index or UUID per line (blank lines
    and `#` comments skipped), written by what starts the engine (on Kubernetes, the engine's
    container, from the GPUs the device plugin gave it: docs/operations.md). Read at every GPU
    reading, so it may appear after the agent starts; until it names a GPU the engine's reports
    carry no NVML figures and say why. Relative to the config file's folder."""

    @model_validator(mode="after")
    def _one_way_to_name_gpus(self) -> AgentEngineConfig:
        if self.gpus is not None and self.gpus_file is not None:
            raise ValueError(f"engine of pool {self.pool!r}: set gpus or gpus_file, not both")
        if self.gpus is not None:
            repeated = _repeated(_gpu_key(g) for g in self.gpus)
            if repeated:
                raise ValueError(f"engine of pool {self.pool!r}: gpus repeat {repeated}")
        return self


class AgentConfig(ConfigModel):
    """The telemetry agent on a GPU node: the engines it watches and its stream to the control
    plane. Either `engines` lists them (several engines, each a pool with its own GPUs), or the
    one-engine shorthand `pool` and `engine_metrics_url` names one engine, whose GPUs are every
    GPU NVML shows; `watched_engines` is the list either way."""

    engines: list[AgentEngineConfig] = Field(default_factory=list)
    """The engines on this node, each the engine of its own pool, with its own /metrics and its
    own GPUs: no pool, /metrics URL or GPU may appear twice. Empty: the one engine of the
    shorthand below."""

    pool: Name | None = None
    """One-engine shorthand (not with engines): the pool of the one engine watched; unset:
    `default`."""

    agent_id: str = ""
    """This agent's name in reports; empty means the host name."""

    controlplane_target: ControlPlaneTarget = "127.0.0.1:50051"
    """host:port of the control plane's gRPC API; or a list, one per control-plane replica:
    each stream goes to the leader (as gateway.controlplane_target)."""

    controlplane_tls: ClientTlsConfig | None = None
    """TLS on the telemetry stream to the control plane (set when controlplane.tls is), with a
    client certificate for mutual TLS; unset: plaintext."""

    controlplane_token_file: str | None = None
    """As gateway.controlplane_token_file, for the agent's telemetry streams: one of the
    control plane's `stream_auth.agent_token_file`."""

    engine_metrics_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    """One-engine shorthand (not with engines): that engine's Prometheus endpoint (vLLM's
    /metrics); unset: `http://127.0.0.1:8000/metrics`."""

    interval_s: PositiveSeconds = 1.0
    """Seconds between two reports of each engine."""

    scrape_timeout_s: PositiveSeconds = 2.0
    """Longest a scrape of an engine's /metrics may take."""

    reconnect_initial_s: PositiveSeconds = 0.2
    """First delay before reconnecting to the control plane; doubles up to reconnect_max_s."""

    reconnect_max_s: PositiveSeconds = 1.0
    """Longest delay between two reconnection attempts. Short, so that a restarted control plane
    hears from everyone within two decision periods; one attempt a second costs nothing."""

    metrics_port: Port = 9101
    """Port of the agent's own Prometheus /metrics endpoint; 0 picks one."""

    metrics_token_file: str | None = None
    """A file holding the bearer token `/metrics` asks for (Prometheus:
    `authorization.credentials_file`), read at start; unset: `/metrics` answers anyone (it holds
    tenant names and counts, no keys). Relative to the config file's folder."""

    host: str = "127.0.0.1"
    """Address the agent's /metrics endpoint binds."""

    @property
    def watched_engines(self) -> tuple[AgentEngineConfig, ...]:
        """The engines this agent watches: `engines`, or the shorthand's one engine (every GPU
        NVML shows is its)."""
        if self.engines:
            return tuple(self.engines)
        return (
            AgentEngineConfig(
                pool=self.pool or DEFAULT_AGENT_POOL,
                metrics_url=self.engine_metrics_url or DEFAULT_ENGINE_METRICS_URL,
            ),
        )

    def engine_of(self, pool: str) -> AgentEngineConfig:
        """The watched engine of `pool`; KeyError when this agent watches none for it."""
        for engine in self.watched_engines:
            if engine.pool == pool:
                return engine
        raise KeyError(pool)

    @model_validator(mode="after")
    def _engines_apart(self) -> AgentConfig:
        if not self.engines:
            return self
        shorthand = [
            name for name in ("pool", "engine_metrics_url") if getattr(self, name) is not None
        ]
        if shorthand:
            raise ValueError(
                f"{' and '.join(shorthand)}: the one-engine shorthand; with engines, give each "
                "engine's pool and metrics_url there"
            )
        for what, values in (
            ("pools", [e.pool for e in self.engines]),
            ("metrics_url values", [e.metrics_url for e in self.engines]),
            ("gpus", [_gpu_key(g) for e in self.engines for g in e.gpus or ()]),
        ):
            repeated = _repeated(values)
            if repeated:
                raise ValueError(f"engines: {what} repeat across engines: {repeated}")
        if len(self.engines) > 1:
            unnamed = [e.pool for e in self.engines if e.gpus is None and e.gpus_file is None]
            if unnamed:
                raise ValueError(
                    f"engines of pools {unnamed} name no GPUs: with several engines, each lists "
                    "its gpus (or a gpus_file; [] for none); every GPU is the default of a lone "
                    "engine only"
                )
            kinds = {type(g) for e in self.engines for g in e.gpus or ()}
            if len(kinds) > 1:
                raise ValueError(
                    "engines: name every engine's gpus the same way, all by index or all by "
                    "UUID, so that one GPU named both ways by two engines cannot pass"
                )
        return self


def _gpu_key(gpu: GpuSelector) -> int | str:
    # A UUID is hex: the same GPU whatever case the config spelled it in.
    return gpu if isinstance(gpu, int) else gpu.lower()


def _repeated(values: Iterable[Hashable]) -> list[Hashable]:
    seen: set[Hashable] = set()
    repeated: list[Hashable] = []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.add(value)
    return repeated
