"""The one configuration model shared by every slotshift service.

All services read the same YAML file (`deploy/local/slotshift.yaml` is the demo); each takes the
sections it needs. Models are frozen and validated on load: a bad file fails at start-up with the
offending field named, never later. Units are in the field names. Environment variables and
command-line flags are applied by the entrypoints (`slotshift_tools.cli`), never read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

PolicyName = Literal["static", "demand", "slo", "agent"]
"""The allocation policies the control plane knows (see controlplane/core/policies.py)."""

PositiveSeconds = Annotated[float, Field(gt=0)]
Port = Annotated[int, Field(ge=0, le=65535)]


class ConfigError(ValueError):
    """A configuration file that cannot be read or does not validate."""


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True
    )


class ServerTlsConfig(_Model):
    """TLS on a server (the control plane's gRPC API, a gateway's HTTP API), optionally mutual.

    Paths are PEM files; a relative path is relative to the config file's folder.
    """

    cert_file: str
    """The server's certificate chain (its certificate first); its names must match the address
    clients dial, or they set server_name."""

    key_file: str
    """The server certificate's private key (unencrypted PEM)."""

    ca_file: str | None = None
    """CA certificates that client certificates are checked against (mutual TLS); unset: clients
    are not asked for a certificate."""

    require_client_cert: bool = False
    """Refuse clients that present no certificate signed by ca_file (mutual TLS)."""

    @model_validator(mode="after")
    def _client_certs_need_a_ca(self) -> ServerTlsConfig:
        if self.require_client_cert and self.ca_file is None:
            raise ValueError("require_client_cert needs ca_file to check client certificates")
        return self


class ClientTlsConfig(_Model):
    """TLS on a client's connection to a server (a gateway's or the agent's to the control plane,
    a gateway's to the engine), with a client certificate for mutual TLS.

    Paths are PEM files; a relative path is relative to the config file's folder.
    """

    ca_file: str | None = None
    """CA certificates the server's certificate is checked against; unset: the system's roots."""

    cert_file: str | None = None
    """This client's certificate chain, presented for mutual TLS; needs key_file."""

    key_file: str | None = None
    """The client certificate's private key (unencrypted PEM); needs cert_file."""

    server_name: str | None = None
    """The name the server's certificate must carry, when it differs from the host dialled (e.g.
    dialling an IP address or a port-forward); unset: the dialled host."""

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> ClientTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self


class TenantConfig(_Model):
    """One tenant of a pool: who it is, how it authenticates, and the bounds on its slots."""

    name: Annotated[
        str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    ]
    """The tenant's name, as it appears in allocations, metrics and traces."""

    api_keys: list[SecretStr] = Field(default_factory=list)
    """API keys (`Authorization: Bearer KEY`) that identify this tenant at the gateways."""

    api_keys_file: str | None = None
    """A file with one API key per line, such as a mounted Kubernetes Secret; its keys are added to
    api_keys when the config is loaded. A relative path is relative to the config file's folder;
    blank lines and lines starting with `#` are ignored."""

    floor_slots: Annotated[int, Field(ge=0)] = 1
    """Slots the tenant always keeps, whatever its demand."""

    ceiling_slots: Annotated[int, Field(ge=0)] | None = None
    """Most slots the tenant may hold pool-wide; unset means the whole budget."""

    weight: Annotated[float, Field(gt=0)] = 1.0
    """The tenant's share of the budget relative to the other tenants (its nominal share), and how
    strongly its demand counts when the demand policy divides contended slots."""

    lendable_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    """slo policy: the part of the tenant's nominal share that may be lent to others while it does
    not use it, in percent (Kubernetes APF's lendablePercent); the rest is a reserve never lent
    (Kueue's lendingLimit counted from the other side)."""

    borrowing_limit_percent: Annotated[float, Field(ge=0)] | None = None
    """slo policy: most the tenant may borrow above its nominal share, in percent of that share
    (APF's borrowingLimitPercent); unset means up to its ceiling."""

    ttft_slo_ms: Annotated[float, Field(gt=0)] | None = None
    """Target p99 time to first token, measured at the gateway from arrival (queueing included)."""

    e2e_slo_ms: Annotated[float, Field(gt=0)] | None = None
    """Target p99 end-to-end latency, measured at the gateway from arrival."""

    preemptible: bool = False
    """Whether the tenant's borrowed work may be paused when a lender needs its slots back, and
    resumed later without loss (docs/preemption.md): meant for batch tenants. Only requests above
    the tenant's own nominal share are ever paused. A tenant that is not preemptible borrows only
    what the other tenants' reserves leave free, so that lending to it never costs a lender its
    reserve."""

    @model_validator(mode="after")
    def _floor_within_ceiling(self) -> TenantConfig:
        if self.ceiling_slots is not None and self.floor_slots > self.ceiling_slots:
            raise ValueError(
                f"floor_slots ({self.floor_slots}) is above ceiling_slots ({self.ceiling_slots})"
            )
        return self


class SloPolicyConfig(_Model):
    """How the slo policy trades throughput against latency (controlplane/core/slo_policy.py)."""

    demand_half_life_s: PositiveSeconds = 2.0
    """How fast the policy forgets a tenant's past demand: rising demand counts at once, falling
    demand decays with this half-life, so that a bursty tenant's slots are lent out gradually."""

    hysteresis_slots: Annotated[int, Field(ge=0)] = 1
    """Changes of at most this many slots per tenant are not made (unless a tenant is owed its
    share back): the limits do not flap with noise in the demand."""

    max_borrow_step_slots: Annotated[int, Field(ge=1)] = 24
    """Most a tenant's limit may grow above its nominal share in one decision. Giving back is not
    limited: a tenant below its nominal share gets what it asks for at once."""

    slo_boost: Annotated[float, Field(ge=0)] = 2.0
    """How strongly a tenant whose p99 latency is over its SLO is favoured: its claim is multiplied
    by 1 + slo_boost x (p99 / SLO - 1)."""

    kv_saturation_perc: Annotated[float, Field(gt=0, le=1)] = 0.95
    """KV-cache usage at or above which the engine counts as saturated: more borrowing would only
    add waiting, so borrowers do not grow further (the cost term)."""

    waiting_saturation_percent: Annotated[float, Field(gt=0, le=100)] = 5.0
    """Requests waiting inside the engine, in percent of the pool's budget (at least one), at or
    above which the engine also counts as saturated. A request waits there briefly between its
    arrival and the next step, so a few waiting is normal and not saturation."""

    full_share_hold_percent: Annotated[float, Field(gt=0, le=100)] | None = 75.0
    """While a tenant that is not preemptible asks at least this percent of its nominal share
    (and no more than all of it), no other tenant holds more than its own nominal share (preemptible tenants' work above it is
    paused): a lender using its share gets the engine as fast as the static split gives it, since
    every request more in the batch makes each of its tokens slower. Unset: borrowing goes on
    beside a busy lender, for more throughput and slower tokens."""

    learned_reserves: bool = False
    """Size each tenant's reserve (the part of its nominal share lent only to preemptible
    tenants, controlplane/core/reserves.py) from its own recent bursts instead of from
    `lendable_percent`: the `reserve_percentile` of its peak concurrency (in flight plus queued)
    in the first `reserve_burst_window_s` of each burst, over a history that decays with
    `reserve_history_half_life_s`; at least its floor, at most `reserve_max_percent` of its
    nominal share. Until a tenant's first burst is recorded, its `lendable_percent` reserve
    applies."""

    reserve_percentile: Annotated[float, Field(gt=0, le=100)] = 95.0
    """Learned reserves: the percentile (in percent) of the recorded bursts' peak concurrency
    that the reserve covers; 100 covers the largest burst of the history."""

    reserve_burst_window_s: PositiveSeconds = 1.0
    """Learned reserves: a burst's peak concurrency is taken over this long from its start (the
    tenant's demand rising above `reserve_idle_demand_slots`): the requests that come before any
    lent slot can return."""

    reserve_idle_demand_slots: Annotated[int, Field(ge=0)] = 0
    """Learned reserves: a tenant whose demand (in flight plus queued) is at most this many slots
    is idle; a burst starts when its demand rises above it."""

    reserve_history_half_life_s: PositiveSeconds = 600.0
    """Learned reserves: a recorded burst counts half as much as a new one after this long, so
    that the reserve follows a tenant whose bursts change; bursts older than ten half-lives are
    forgotten. Choose it longer than the time between a tenant's bursts."""

    reserve_max_percent: Annotated[float, Field(ge=0, le=100)] = 100.0
    """Learned reserves: the most a learned reserve may be, in percent of the tenant's nominal
    share (never below its floor)."""


class AgentPolicyConfig(_Model):
    """The agent policy: an LLM behind any OpenAI-compatible chat endpoint proposes the limits;
    a rule-based policy decides whenever its answer is late, invalid or failing."""

    url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the OpenAI-compatible API (`/chat/completions` is appended)."""

    model: str = "Qwen/Qwen2.5-3B-Instruct"
    """The model to ask."""

    api_key: SecretStr | None = None
    """Sent as `Authorization: Bearer`; unset sends none."""

    deadline_ms: Annotated[float, Field(gt=0)] = 500.0
    """Longest the control loop waits for an answer; past it the fallback decides."""

    fallback: Literal["static", "demand", "slo"] = "slo"
    """The rule-based policy that decides when the agent's answer cannot be used."""

    max_tokens: Annotated[int, Field(ge=16)] = 512
    """Most tokens the answer may take."""

    temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    """Sampling temperature; 0 for the most repeatable answers."""


class PreemptionConfig(_Model):
    """Pausing preemptible tenants' borrowed work so that a lender gets its slots back at once."""

    enabled: bool = True
    """Pause borrowed work of preemptible tenants when a lender is owed slots; off, a lent slot
    comes back only when the borrower's request in it ends."""

    max_pauses_per_request: Annotated[int, Field(ge=0)] = 2
    """Most times one request is paused; a request paused that often runs to its end, so that a
    resumed request is not the youngest victim of every burst."""

    max_waste_percent: Annotated[float, Field(ge=0, le=100)] = 3.0
    """Most waste (output tokens discarded by restarts, plus prompt tokens recomputed on resume
    that were not prefix-cache hits) the pool accepts, in percent of its output tokens over the
    last `waste_window_s`; above it the control plane waits for borrowed work to end instead of
    pausing it. The waste is charged to the pool, never to a tenant."""

    waste_window_s: PositiveSeconds = 60.0
    """The window over which the waste share is measured."""


class PoolConfig(_Model):
    """One pool: one inference server (one vLLM engine) with its own fixed slot budget."""

    name: Annotated[
        str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    ]
    """The pool's name; every API message names its pool."""

    budget_slots: Annotated[int, Field(ge=1)]
    """Requests the pool lets into the engine at once, over all tenants and gateways."""

    policy: PolicyName = "demand"
    """The allocation policy that moves slots between this pool's tenants."""

    decision_period_s: PositiveSeconds = 2.0
    """Seconds between two allocation decisions."""

    engine_url: str = "http://127.0.0.1:8000"
    """Base URL of the engine's OpenAI-compatible API (the gateways proxy to it)."""

    engine_tls: ClientTlsConfig | None = None
    """How the gateways check an https engine_url (vLLM's --ssl-certfile), with a client
    certificate if the engine requires one (--ssl-ca-certs, --ssl-cert-reqs 2); unset: the
    system's roots for https."""

    fast_path: bool = True
    """Decide at once, not at the next period, when a tenant's queue grows while it holds less
    than its nominal share (so that lent slots start coming back without delay)."""

    fast_path_min_interval_s: PositiveSeconds = 0.02
    """Least time between the starts of two decisions the fast path triggers. A burst reaches
    the gateways a few milliseconds apart, so the first decision may see only part of it; the
    next one, this long after, sees the rest (at 0.1 s the lender's p99 TTFT in
    bench/scenarios/burst-full-share.yaml was 173 ms, at 0.02 s 101 ms). At most
    1 / this many fast-path decisions a second."""

    tenants: list[TenantConfig]
    """The tenants sharing the budget."""

    slo_policy: SloPolicyConfig = SloPolicyConfig()
    """Settings of the slo policy (used when `policy` is slo, or as the agent's fallback)."""

    agent_policy: AgentPolicyConfig = AgentPolicyConfig()
    """Settings of the agent policy (used when `policy` is agent)."""

    preemption: PreemptionConfig = PreemptionConfig()
    """How borrowed work of preemptible tenants is paused and resumed (docs/preemption.md)."""

    def ceiling_of(self, tenant: TenantConfig) -> int:
        """The tenant's effective ceiling: its own, or the whole budget."""
        if tenant.ceiling_slots is None:
            return self.budget_slots
        return min(tenant.ceiling_slots, self.budget_slots)

    @model_validator(mode="after")
    def _budget_fits_bounds(self) -> PoolConfig:
        if not self.tenants:
            raise ValueError("a pool needs at least one tenant")
        names = [t.name for t in self.tenants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tenant names repeat: {duplicates}")
        floors = sum(t.floor_slots for t in self.tenants)
        if floors > self.budget_slots:
            raise ValueError(
                f"tenants' floor_slots sum to {floors}, above budget_slots ({self.budget_slots})"
            )
        ceilings = sum(self.ceiling_of(t) for t in self.tenants)
        if ceilings < self.budget_slots:
            raise ValueError(
                f"tenants' ceiling_slots sum to {ceilings}, below budget_slots "
                f"({self.budget_slots}): the budget could not be handed out in full"
            )
        return self


class ControlPlaneConfig(_Model):
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

    tls: ServerTlsConfig | None = None
    """TLS on the gRPC API (gateways, agents, grpcurl), mutual with require_client_cert; unset:
    plaintext. The gateways' and the agent's controlplane_tls must then be set to match."""

    admin_token_file: str | None = None
    """A file holding the admin token (its first line), such as a mounted Kubernetes Secret: the
    admin API's changes (AdminService, all but GetPoolConfig) need `authorization: Bearer TOKEN`.
    A relative path is relative to the config file's folder. Unset: the admin API refuses every
    change."""


class GatewayConfig(_Model):
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


class AgentConfig(_Model):
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


class EngineSimConfig(_Model):
    """The vLLM emulator: an OpenAI-compatible server that models continuous batching."""

    host: str = "127.0.0.1"
    """Address the emulator binds."""

    port: Port = 8000
    """Port of its OpenAI API and /metrics; 0 picks one."""

    profile: Literal["h200-qwen2.5-3b", "h200-qwen2.5-7b"] = "h200-qwen2.5-3b"
    """The emulated GPU and model (see engine_sim/profiles.py): step-time costs, batch limits,
    KV-cache size and memory. Every field below that is unset (null) takes the profile's value;
    a value set here overrides the profile's. The emulator refuses to start, as vLLM would, when
    one full-length request does not fit the KV cache or weights and cache exceed GPU memory."""

    model_name: str | None = None
    """The model name it serves and labels its metrics with; unset: the profile's model."""

    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    """Most sequences in one batch (vLLM's --max-num-seqs); unset: the profile's."""

    max_num_batched_tokens: Annotated[int, Field(ge=1)] | None = None
    """Most tokens one step processes, prefill and decode together; unset: the profile's."""

    kv_cache_blocks: Annotated[int, Field(ge=1)] | None = None
    """KV-cache capacity in blocks (requests wait when it is full); unset: the profile's."""

    block_size_tokens: Annotated[int, Field(ge=1)] = 16
    """Tokens per KV-cache block."""

    max_model_len: Annotated[int, Field(ge=16)] = 32768
    """Longest prompt plus output, in tokens."""

    step_base_ms: Annotated[float, Field(ge=0)] | None = None
    """Fixed cost of one engine step; unset: the profile's."""

    step_per_seq_ms: Annotated[float, Field(ge=0)] | None = None
    """Added step time per sequence in the batch; unset: the profile's."""

    step_per_context_token_us: Annotated[float, Field(ge=0)] | None = None
    """Added step time per context token held by the batch, in microseconds; unset: the
    profile's."""

    step_per_prefill_token_us: Annotated[float, Field(ge=0)] | None = None
    """Added step time per prompt token prefilled in the step, in microseconds; unset: the
    profile's."""

    default_max_tokens: Annotated[int, Field(ge=1)] = 256
    """Output tokens a request gets when its max_tokens is unbounded (capped by max_model_len):
    a chat that names none, or a completion whose max_tokens is null (vLLM's own default
    for a completion without the key, 16, applies as in vLLM)."""

    pseudo_eos_max_tokens: Annotated[int, Field(ge=1)] = 1024
    """Without ignore_eos a request stops at a pseudo end-of-sequence that each sampled token is
    with probability 2 / (this + 1), a function of the context (engine_sim/tokens.py): output
    lengths are geometric with mean (this + 1) / 2, the mean of a uniform 1..this law (unless
    max_tokens comes first; min_tokens delays it)."""

    enable_prefix_caching: bool = True
    """Cache full KV blocks by their tokens' chained hash and let later requests that start with
    the same tokens skip computing them (vLLM's --enable-prefix-caching, on by default in V1)."""

    enable_prompt_tokens_details: bool = False
    """Report usage.prompt_tokens_details.cached_tokens, the prompt tokens found in the prefix
    cache (vLLM's --enable-prompt-tokens-details, off by default)."""

    gpu_memory_total_bytes: Annotated[int, Field(ge=1)] | None = None
    """Memory of the emulated GPU as NVML reports it; unset: the profile's (an H200)."""

    model_weights_bytes: Annotated[int, Field(ge=0)] | None = None
    """Memory the emulated model's weights hold; unset: the profile's (bf16 weights)."""

    kv_cache_bytes_per_token: Annotated[int, Field(ge=1)] | None = None
    """KV-cache memory one token holds (layers x KV heads x head dims x K,V x 2 bytes); with
    kv_cache_blocks it sets the emulated memory in use; unset: the profile's."""

    gpu_utilization_window_s: PositiveSeconds = 1.0
    """Seconds over which the emulated GPU utilisation (busy time / wall time) is averaged."""

    shutdown_grace_s: PositiveSeconds = 5.0
    """Seconds running requests get to finish when the emulator stops; the rest are aborted."""


class LocalStackConfig(_Model):
    """What `slotshift up` starts on one machine."""

    gateway_ports: list[Port] = Field(default_factory=lambda: [8080, 8081])
    """One gateway process per port."""

    start_engine_sim: bool = True
    """Start the emulator (false when a real engine serves the pool's engine_url)."""

    ready_timeout_s: PositiveSeconds = 30.0
    """Seconds each service gets to become ready."""

    engine: Literal["emulator", "vllm"] = "emulator"
    """The engine `slotshift up` starts: the emulator (if start_engine_sim), or real vLLM on the
    CPU with a tiny local model (slotshift_tools/vllm_cpu; needs a checkout, builds its venv the
    first time), which the gateways' pool and the agent are then pointed at."""

    vllm_port: Port | None = None
    """Port of the CPU vLLM server; unset: the port of the pool's engine_url (where the emulator
    would listen, so whatever is pointed at the engine finds vLLM there); 0 picks a free one."""

    vllm_served_model_name: str = "slotshift/tiny-llama"
    """The model name the CPU vLLM serves (clients put it in `model`)."""

    vllm_max_num_seqs: Annotated[int, Field(ge=1)] = 64
    """vLLM's --max-num-seqs: requests in one batch; beyond it requests wait inside vLLM."""

    vllm_block_size_tokens: Annotated[int, Field(ge=32, multiple_of=32)] | None = 32
    """vLLM's --block-size: KV-cache block tokens (its CPU build takes multiples of 32). Small
    blocks let a paused request's continuation hit the prefix cache (it hits whole blocks
    only); unset: vLLM's own choice (128 on the CPU)."""

    vllm_ready_timeout_s: PositiveSeconds = 120.0
    """Seconds the CPU vLLM gets to answer /health (35-100 s here: the first start of a model
    compiles it)."""

    vllm_otlp_traces_endpoint: str | None = None
    """vLLM's --otlp-traces-endpoint (OTLP/gRPC, e.g. http://127.0.0.1:4317); unset: no traces."""


class SlotshiftConfig(_Model):
    """The whole configuration file."""

    pools: list[PoolConfig]
    """The pools the control plane manages."""

    controlplane: ControlPlaneConfig = ControlPlaneConfig()
    gateway: GatewayConfig = GatewayConfig()
    agent: AgentConfig = AgentConfig()
    engine_sim: EngineSimConfig = EngineSimConfig()
    local_stack: LocalStackConfig = LocalStackConfig()

    def pool(self, name: str) -> PoolConfig:
        """The pool called `name`; KeyError if there is none."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    @model_validator(mode="after")
    def _pools_unique(self) -> SlotshiftConfig:
        if not self.pools:
            raise ValueError("at least one pool is needed")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names repeat: {names}")
        return self


def validation_problems(exc: ValidationError) -> str:
    """Each bad field of a document, by its dotted path, with pydantic's message."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
    )


def parse_config(data: Mapping[str, Any], *, source: str = "<config>") -> SlotshiftConfig:
    """Validate a parsed document; ConfigError names each bad field."""
    try:
        return SlotshiftConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {validation_problems(exc)}") from exc


def load_config(path: Path) -> SlotshiftConfig:
    """Read and validate a YAML configuration file, with the tenants' api_keys_file read in."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    config = parse_config(data, source=str(path))
    config = _with_tls_paths(_with_key_files(config, path), path.parent)
    return _with_admin_token_path(config, path.parent)


def _with_admin_token_path(config: SlotshiftConfig, base: Path) -> SlotshiftConfig:
    """controlplane.admin_token_file made absolute, relative to `base` (the config's folder)."""
    token_file = config.controlplane.admin_token_file
    if token_file is None:
        return config
    controlplane = config.controlplane.model_copy(
        update={"admin_token_file": str((base / token_file).absolute())}
    )
    return config.model_copy(update={"controlplane": controlplane})


def _with_key_files(config: SlotshiftConfig, config_path: Path) -> SlotshiftConfig:
    """Add each tenant's api_keys_file keys to its api_keys; the path becomes absolute."""
    if not any(t.api_keys_file for pool in config.pools for t in pool.tenants):
        return config
    data = config.model_dump(mode="python")
    _reveal_secrets(data)
    for pool in data["pools"]:
        for tenant in pool["tenants"]:
            if tenant["api_keys_file"] is None:
                continue
            keys_path = config_path.parent / tenant["api_keys_file"]
            try:
                text = keys_path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"{config_path}: tenant {tenant['name']!r} of pool {pool['name']!r}: "
                    f"cannot read api_keys_file {keys_path}: {exc}"
                ) from exc
            tenant["api_keys"] += _keys_in(text)
            # Absolute, so that a dump of this config names the file wherever it is read again.
            tenant["api_keys_file"] = str(keys_path.absolute())
    return parse_config(data, source=str(config_path))


_Tls = TypeVar("_Tls", ServerTlsConfig, ClientTlsConfig)


def _with_tls_paths(config: SlotshiftConfig, base: Path) -> SlotshiftConfig:
    """Make the TLS sections' file paths absolute, relative to `base` (the config's folder), so
    that they name the same files whatever the services' working directory."""

    def resolved(tls: _Tls | None) -> _Tls | None:
        if tls is None:
            return None
        paths = {"cert_file": tls.cert_file, "key_file": tls.key_file, "ca_file": tls.ca_file}
        return tls.model_copy(
            update={k: str((base / v).absolute()) for k, v in paths.items() if v is not None}
        )

    controlplane = config.controlplane.model_copy(update={"tls": resolved(config.controlplane.tls)})
    gateway = config.gateway.model_copy(
        update={
            "tls": resolved(config.gateway.tls),
            "controlplane_tls": resolved(config.gateway.controlplane_tls),
        }
    )
    agent = config.agent.model_copy(
        update={"controlplane_tls": resolved(config.agent.controlplane_tls)}
    )
    pools = [
        pool.model_copy(update={"engine_tls": resolved(pool.engine_tls)}) for pool in config.pools
    ]
    return config.model_copy(
        update={"pools": pools, "controlplane": controlplane, "gateway": gateway, "agent": agent}
    )


def _keys_in(text: str) -> list[str]:
    """The keys of an api_keys_file: one per line, blank lines and `#` comments skipped."""
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]


def apply_overrides(config: SlotshiftConfig, overrides: Mapping[str, Any]) -> SlotshiftConfig:
    """Return a copy with dotted-path overrides applied and re-validated.

    A path names fields by name and list items by index: `gateway.port` = 8081,
    `pools.0.decision_period_s` = 1.0.
    """
    data = config.model_dump(mode="python")
    _reveal_secrets(data)
    for dotted, value in overrides.items():
        node: Any = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = _child(node, part, dotted)
        _child(node, leaf, dotted)
        node[int(leaf) if isinstance(node, list) else leaf] = value
    return parse_config(data, source="overrides")


def _child(node: Any, part: str, dotted: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise ConfigError(f"override {dotted}: no field or item {part!r}")


def _reveal_secrets(data: Any) -> None:
    """SecretStr dumps as itself; turn it back into text so the dump validates again."""
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, SecretStr):
                data[key] = value.get_secret_value()
            else:
                _reveal_secrets(value)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            if isinstance(value, SecretStr):
                data[index] = value.get_secret_value()
            else:
                _reveal_secrets(value)
