"""The control plane as one object: gRPC server, decision loops and /metrics, started and stopped
in order; the state store opened, and the pools restored from it, before anything serves.

Every replica stands for the leader lease in the store (controlplane/leadership.py). The leader
restores the pools from the store as it is elected (another leader may have changed them), then
decides, publishes under its epoch, keeps state in the store, and reports SERVING for every
service. A follower answers queries (AllocationService; GetDecisions reads the shared store) and
health, reports NOT_SERVING for the leader's services and refuses their calls
(controlplane/leader_gate.py). A leader that loses its lease stops publishing and drops its
streams at once, and `deposed` is set: `slotshift controlplane` then exits (status
DEPOSED_EXIT_STATUS, controlplane/main.py) to come back as a fresh follower.

Given the source its config was read from, it reloads the file on `reload_config` (SIGHUP,
controlplane/main.py) and when the file changes (controlplane/config_reload.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controlplane.config_reload import ConfigReloader, ReloadOutcome
from controlplane.decision_loop import DecisionObserver
from controlplane.leader_gate import LEADER_SERVICES, LeaderGate
from controlplane.leadership import LeaderElection
from controlplane.metrics import ControlPlaneMetrics
from controlplane.pool_state import PoolState
from controlplane.reflection import add_reflection
from controlplane.replica_watch import ReplicaWatch
from controlplane.runtime import PoolRuntime
from controlplane.service.admin_service import PoolAdminService
from controlplane.service.gateway_service import GatewayStreamService
from controlplane.service.query_service import AllocationQueryService
from controlplane.service.read_auth import BearerTokens, ReadGate, load_read_tokens
from controlplane.service.stream_guard import StreamGuard, load_stream_credentials
from controlplane.service.telemetry_service import TelemetryIngestService
from controlplane.state_keeper import StateKeeper
from controlplane.store.base import StateStore
from controlplane.store.opening import store_from_config
from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock, SystemClock
from slotshift.config import (
    ConfigError,
    ConfigSource,
    PoolConfig,
    SlotshiftConfig,
    key_digester,
    read_secret_text,
)
from slotshift.keys import bearer_matches
from slotshift.metrics_guard import metrics_token_digest, metrics_unauthorized
from slotshift.tls import load_server_credentials
from slotshift.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    query_pb2,
    query_pb2_grpc,
    telemetry_pb2,
    telemetry_pb2_grpc,
)

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    query_pb2.DESCRIPTOR.services_by_name["AllocationService"].full_name,
    gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name,
    telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    health.SERVICE_NAME,
)


class ControlPlane:
    """Owns the pools' state and everything that serves it.

    tracer_provider: where its spans go (decisions, pushes, connections); no-op by default.
    state_store: the store to keep state in, not yet opened (tests); by default the one
    controlplane.state_store names. Either is opened by start() and closed by stop().
    decision_observers: called with every decision of every pool, after the metrics (the
    deterministic twin keeps its run's decisions so).
    source: where `config` was read from (`ConfigSource.load()` gave it); with it the control
    plane reloads the file (`reload_config`, and the watch: controlplane.config_reload_interval_s).
    None: a config built in code, never reloaded.

    Everything is built here from the config, nothing started: `start` opens the servers and
    spawns each pool's decision loop and re-grants. The twin (slotshift_tools/twin) runs these
    same objects in one process on a virtual clock, without the servers: `pools`, `runtimes`
    and `gateway_service` are its entry points (no state store: nothing is restored or kept).
    """

    def __init__(
        self,
        config: SlotshiftConfig,
        *,
        clock: Clock | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        state_store: StateStore | None = None,
        decision_observers: list[DecisionObserver] | None = None,
        source: ConfigSource | None = None,
    ) -> None:
        self._config = config
        self._file_pools: dict[str, PoolConfig] = {pool.name: pool for pool in config.pools}
        """pool -> the pool as the config file says it: the base the stored admin changes apply
        to, shared with the state keeper and the admin API, replaced by a reload."""
        self._store = state_store
        self.keeper: StateKeeper | None = None
        """The state keeper, once start() has opened the store and restored the pools."""
        self._clock = clock or SystemClock()
        provider = tracer_provider if tracer_provider is not None else trace.NoOpTracerProvider()
        self._tracer = provider.get_tracer("slotshift.controlplane")
        settings = config.controlplane
        self._digester = key_digester(config.tenant_keys)
        self.pools = {
            pool.name: PoolState(
                pool,
                key_digester=self._digester,
                clock=self._clock,
                gateway_lease_ttl_s=settings.gateway_lease_ttl_s,
                telemetry_stale_after_s=settings.telemetry_stale_after_s,
                decision_log_size=settings.decision_log_size,
            )
            for pool in config.pools
        }
        self.metrics = ControlPlaneMetrics(self.pools)
        self.runtimes = {
            name: PoolRuntime(
                state,
                clock=self._clock,
                reconcile_min_interval_s=settings.reconcile_min_interval_ms / 1000,
                reconcile_max_cores=settings.reconcile_max_cores,
                observers=[self.metrics.observe_decision, *(decision_observers or [])],
                tracer=self._tracer,
            )
            for name, state in self.pools.items()
        }
        self._stream_guard = StreamGuard(on_rejection=self.metrics.observe_stream_rejection)
        self.gateway_service = GatewayStreamService(
            self.pools,
            on_ack=self.metrics.observe_ack,
            tracer=self._tracer,
            clock=self._clock,
            push_min_interval_s=settings.push_min_interval_ms / 1000,
            guard=self._stream_guard,
        )
        """The gateways' stream: Connect on the gRPC server, `serve` on any other stream."""
        self._tasks = Supervisor("controlplane")
        self._leader_tasks = Supervisor("controlplane-leader")
        self.election: LeaderElection | None = None
        """This replica's part in the leader election, once start() has opened the store."""
        self.replica_watch = ReplicaWatch(
            lambda: self.config,
            self.runtimes,
            settings=settings.replica_loss,
            clock=self._clock,
            lock=self._reload_lock,
            keeper=lambda: self.keeper,
        )
        """The replica groups' lost members (controlplane/replica_watch.py); it runs while this
        replica leads."""
        self._reloader = (
            None
            if source is None
            else ConfigReloader(
                source,
                config,
                file_pools=self._file_pools,
                runtimes=self.runtimes,
                key_digester=self._digester,
                keeper=lambda: self.keeper,
                leading=lambda: self._leading,
                on_result=self.metrics.observe_config_reload,
                live_bounds=self.replica_watch.bounds,
            )
        )
        self.deposed = asyncio.Event()
        """Set once this replica has led and stopped leading (lost its lease): it publishes no
        more, and its owner restarts it (controlplane/main.py)."""
        self._leading = False
        # `aio` is set only when grpc.aio imports, so the stubs do not declare it.
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._server: grpc.aio.Server | None = None
        self._admin_token: str | None = None
        self._read_tokens: BearerTokens | None = None
        """What the read-only calls accept (ReadGate); None: they are open."""
        self._metrics_runner: web.AppRunner | None = None
        self.grpc_port = 0
        self.metrics_port = 0

    async def start(self) -> None:
        """Open the state store and restore the pools (nothing serves before), then serve:
        gRPC, /metrics, the decision loops. A start that fails stops what it started (the
        store closed too) and raises; ConfigError, before anything is opened, when the streams
        have no credentials (controlplane.stream_auth) or a token file (the streams', the
        admin's, the queries') cannot be read."""
        settings = self.config.controlplane
        self._stream_guard.load(
            await asyncio.to_thread(load_stream_credentials, settings.stream_auth)
        )
        self._admin_token = await asyncio.to_thread(_read_admin_token, settings.admin_token_file)
        self._read_tokens = await asyncio.to_thread(
            load_read_tokens, settings.query_token_file, self._admin_token
        )
        if not self._digester.is_keyed:
            logger.warning(
                "tenants' API keys are digested unkeyed (SHA-256): %s",
                "tenant_keys.unkeyed_key_digests is set"
                if self.config.tenant_keys.unkeyed_key_digests
                else "this config, built in code, sets no key-digest secret",
            )
        if self._reloader is not None:
            await self._reloader.look()
        keeper = await self._restore()
        try:
            await self._stand(keeper)
            await self._serve(keeper)
        except BaseException:
            # A half-started control plane must not leave its server or its store behind.
            await self.stop()
            raise

    @property
    def config(self) -> SlotshiftConfig:
        """The config it runs on: as given, or as last reloaded (its pools as the file says;
        each pool runs that with the stored admin changes on top)."""
        return self._config if self._reloader is None else self._reloader.config

    async def reload_config(self, trigger: str = "reload_config") -> ReloadOutcome:
        """Read the config file again and apply what changed (controlplane/config_reload.py),
        `trigger` naming why in the logs and the decisions; a refusal is logged and counted, the
        running config kept. RuntimeError when it was built without a source."""
        if self._reloader is None:
            raise RuntimeError("this control plane was built without a config source")
        return await self._reloader.reload(trigger)

    def request_reload(self, trigger: str = "SIGHUP") -> None:
        """Reload soon, in the background (a signal handler: it neither blocks nor awaits);
        nothing when built without a source or not started."""
        if self._reloader is not None:
            self._reloader.request(trigger)

    @property
    def leading(self) -> bool:
        """Whether this replica leads now (it publishes allocations and serves the streams)."""
        return self._leading

    async def _stand(self, keeper: StateKeeper) -> None:
        """Stand for the leader lease once before serving: a replica that gets it leads from
        its first call (restoring the pools under the lease); one that does not restores them
        for its queries and follows, standing again in the background."""
        settings = self.config.controlplane
        election = LeaderElection(
            keeper.store,
            holder=settings.replica_id or socket.gethostname(),
            ttl_s=settings.leader_lease_ttl_s,
            clock=self._clock,
            on_elected=self._lead,
            on_deposed=self._step_down,
        )
        self.election = election
        await election.step()
        if not election.leading:
            await keeper.restore()
            logger.info("controlplane follows: the leader lease is held by another replica")

    async def _lead(self, epoch: int) -> None:
        """Elected: restore the pools from the store as the last leader left them, then decide
        and publish under `epoch`, and say SERVING for the leader's services."""
        keeper = self.keeper
        assert keeper is not None  # the election runs only once the store is open
        async with self._reload_lock():
            # Not while a reload takes the file as the base: restored on one base or the other.
            await keeper.restore()
            self._leading = True
        self.gateway_service.epoch = epoch
        tasks = self._leader_tasks
        tasks.spawn("state-store/decisions", keeper.write_decisions())
        tasks.spawn("state-store/versions", keeper.keep_versions_ahead())
        tasks.spawn("state-store/retention", keeper.apply_retention())
        tasks.spawn("state-store/gateways", keeper.keep_gateways())
        tasks.spawn("replica-watch", self.replica_watch.run())
        for name, runtime in self.runtimes.items():
            tasks.spawn(f"decision-loop/{name}", runtime.decisions())
            tasks.spawn(f"regrants/{name}", runtime.regrants())
        for service in LEADER_SERVICES:
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        logger.info("controlplane leads, epoch %d", epoch)

    def _reload_lock(self) -> contextlib.AbstractAsyncContextManager[object]:
        return contextlib.nullcontext() if self._reloader is None else self._reloader.lock

    def _step_down(self, reason: str, *, deposed: bool = True) -> None:
        """The lease is lost (or given up): publish nothing more, now. The decision loops and
        the re-grants are cancelled, every gateway's stream is ended, the leader's calls are
        refused from here on; when `deposed` (not a stop), `deposed` is set and health follows
        in a task."""
        if not self._leading:
            return
        self._leading = False
        for task in self._leader_tasks.tasks:
            task.cancel()
        for state in self.pools.values():
            state.close_sessions()
        if not deposed:
            return
        self.deposed.set()
        logger.error(
            "controlplane no longer leads (%s): publishing stopped, streams dropped", reason
        )
        self._tasks.spawn("step-down", self._stepped_down(), forever=False)

    async def _stepped_down(self) -> None:
        for service in LEADER_SERVICES:
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._leader_tasks.stop()

    async def _serve(self, keeper: StateKeeper) -> None:
        settings = self.config.controlplane
        server = grpc.aio.server(
            interceptors=[ReadGate(self._read_tokens), LeaderGate(lambda: self._leading)]
        )
        query_pb2_grpc.add_AllocationServiceServicer_to_server(
            AllocationQueryService(self.pools, history=keeper.history), server
        )
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(self.gateway_service, server)
        telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(
            TelemetryIngestService(
                self.pools,
                self._clock,
                on_report=self.metrics.observe_telemetry,
                tracer=self._tracer,
                guard=self._stream_guard,
            ),
            server,
        )
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            PoolAdminService(
                self.runtimes,
                admin_token=self._admin_token,
                key_digester=self._digester,
                record=keeper.record_change,
                file_pools=self._file_pools,
                clock=self._clock,
            ),
            server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        add_reflection(server, SERVICE_NAMES)
        address = f"{settings.grpc_host}:{settings.grpc_port}"
        if settings.tls is None:
            self.grpc_port = server.add_insecure_port(address)
        else:
            credentials = await asyncio.to_thread(load_server_credentials, settings.tls)
            self.grpc_port = server.add_secure_port(address, credentials)
        if self.grpc_port == 0:
            raise OSError(f"cannot bind gRPC on {settings.grpc_host}:{settings.grpc_port}")
        await server.start()
        self._server = server
        self._metrics_runner = await self._start_metrics(settings.grpc_host, settings.metrics_port)
        assert self.election is not None
        self._tasks.spawn("leader-election", self.election.run(), forever=False)
        if self._reloader is not None:
            self._tasks.spawn("config-reload", self._reloader.watch())
        leader_status = (
            health_pb2.HealthCheckResponse.SERVING
            if self._leading
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", *SERVICE_NAMES[:-1]):
            await self._health.set(
                service,
                leader_status
                if service in LEADER_SERVICES
                else health_pb2.HealthCheckResponse.SERVING,
            )
        logger.info(
            "controlplane ready (%s): gRPC%s on %s:%d, metrics on :%d, pools %s",
            "leader" if self._leading else "follower",
            "" if settings.tls is None else " (TLS)",
            settings.grpc_host,
            self.grpc_port,
            self.metrics_port,
            sorted(self.pools),
        )

    async def _restore(self) -> StateKeeper:
        """Open the state store and restore the pools from it: StoreError, or TimeoutError
        after connect_timeout_s, when it cannot be opened or read; ConfigError when its settings
        are wrong (the store is closed again then)."""
        settings = self.config.controlplane
        store = self._store or await store_from_config(settings.state_store)
        try:
            async with asyncio.timeout(settings.state_store.connect_timeout_s):
                await store.open()
            keeper = StateKeeper(
                store,
                settings.state_store,
                file_pools=self._file_pools,
                runtimes=self.runtimes,
                clock=self._clock,
                decision_log_size=settings.decision_log_size,
                key_digester=self._digester,
                drop_stale=self.config.tenant_keys.drop_stale_key_changes,
            )
            await keeper.restore()
        except BaseException:
            await store.close()
            raise
        self.keeper = keeper
        return keeper

    async def _start_metrics(self, host: str, port: int) -> web.AppRunner:
        token_file = self.config.controlplane.metrics_token_file
        token = (
            None
            if token_file is None
            else await asyncio.to_thread(
                metrics_token_digest, token_file, "controlplane.metrics_token_file"
            )
        )

        async def metrics(request: web.Request) -> web.Response:
            if token is not None and not bearer_matches(
                request.headers.get("Authorization"), token
            ):
                return metrics_unauthorized()
            return web.Response(
                body=generate_latest(self.metrics.registry),
                headers={"Content-Type": CONTENT_TYPE_LATEST},
            )

        async def healthz(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self.metrics_port = runner.addresses[0][1]
        return runner

    async def stop(self) -> None:
        """Health NOT_SERVING, stop deciding, end the gateways' streams, hand the leader lease
        over (a follower takes it at once), stop serving."""
        await self._health.enter_graceful_shutdown()
        self._step_down("stopping", deposed=False)
        await self._leader_tasks.stop()
        if self.election is not None:
            # Only once nothing publishes: the next leader may start the moment it is released.
            await self.election.resign()
        await self._tasks.stop()
        for runtime in self.runtimes.values():
            await runtime.close()
        for state in self.pools.values():
            state.close_sessions()
        if self._server is not None:
            await self._server.stop(self.config.controlplane.shutdown_grace_s)
            self._server = None
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
            self._metrics_runner = None
        if self.keeper is not None:
            await self.keeper.close()
            self.keeper = None
        logger.info("controlplane stopped")


def _read_admin_token(path: str | None) -> str | None:
    """The admin token: the first line of `path`; None when no file is configured."""
    if path is None:
        return None
    lines = read_secret_text(path, field="controlplane.admin_token_file").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ConfigError(f"controlplane.admin_token_file: {path} holds no token")
    return token
