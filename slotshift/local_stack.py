"""`slotshift up`: the whole stack on one machine, as separate processes started as a user would.

Start order: emulator, control plane, gateways, agent; each must be ready (its health endpoint
answers) before the next starts. Stop order is the reverse, each with SIGTERM and a grace period
before SIGKILL. Every child's output is forwarded line by line, prefixed with its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slotshift.aiotasks import Supervisor
from slotshift.config import SlotshiftConfig

logger = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


class StackError(RuntimeError):
    """A service of the local stack failed to start."""


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process


class LocalStack:
    """The processes of the local stack."""

    def __init__(
        self, config: SlotshiftConfig, config_path: Path, overrides: list[str], log_level: str
    ) -> None:
        self.config = config
        self._base_args = ["--config", str(config_path), "--log-level", log_level]
        for pair in overrides:
            self._base_args += ["--set", pair]
        self._children: list[Child] = []
        self._tasks = Supervisor("local-stack")

    async def start(self) -> None:
        config = self.config
        timeout_s = config.local_stack.ready_timeout_s
        if config.local_stack.start_engine_sim:
            sim = config.engine_sim
            await self._start(
                "engine-sim", [], _http_ok(f"http://{sim.host}:{sim.port}/health"), timeout_s
            )
        cp = config.controlplane
        await self._start(
            "controlplane", [], _grpc_serving(f"{cp.grpc_host}:{cp.grpc_port}"), timeout_s
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

    async def _start(
        self,
        name: str,
        extra: list[str],
        ready: Callable[[], Awaitable[bool]],
        timeout_s: float,
        *,
        command: str | None = None,
    ) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "slotshift",
            command or name,
            *self._base_args,
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # Own process group: Ctrl-C reaches `up`, which stops the children in order.
            start_new_session=True,
        )
        child = Child(name, process)
        self._children.append(child)
        self._tasks.spawn(f"forward-output/{name}", self._forward(child), forever=False)
        deadline = time.monotonic() + timeout_s
        while not await ready():
            if process.returncode is not None:
                raise StackError(f"{name} exited with status {process.returncode} while starting")
            if time.monotonic() > deadline:
                raise StackError(f"{name} was not ready within {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
        logger.info("%s is ready (pid %d)", name, process.pid)

    async def _forward(self, child: Child) -> None:
        assert child.process.stdout is not None
        width = max(len("controlplane"), len(child.name))
        async for line in child.process.stdout:
            sys.stdout.write(f"{child.name:<{width}} | {line.decode(errors='replace')}")
            sys.stdout.flush()

    def failed(self) -> list[str]:
        """Children that have exited on their own."""
        return [c.name for c in self._children if c.process.returncode is not None]

    async def stop(self) -> None:
        """SIGTERM each child in reverse start order; SIGKILL what outlives the grace period."""
        for child in reversed(self._children):
            if child.process.returncode is None:
                child.process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(child.process.wait(), STOP_GRACE_S)
                except TimeoutError:
                    logger.warning(
                        "%s did not stop within %.0f s; killing it", child.name, STOP_GRACE_S
                    )
                    child.process.kill()
                    await child.process.wait()
            logger.info("%s stopped (status %s)", child.name, child.process.returncode)
        await self._tasks.stop()


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


def _grpc_serving(target: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    return check


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
    stack = LocalStack(config, config_path, overrides, log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    status = 0
    try:
        await stack.start()
        if demo:
            from slotshift.demo import run_demo

            ok = await run_demo(config, duration_s=demo_duration_s)
            status = 0 if ok else 1
        else:
            print(_banner(config), flush=True)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                if stack.failed():
                    logger.error("stopping: %s exited", ", ".join(stack.failed()))
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
    return (
        "\nslotshift is up. OpenAI-compatible gateways: "
        f"{gateways}\n"
        f"Control plane (grpcurl -plaintext {config.controlplane.grpc_host}:"
        f"{config.controlplane.grpc_port} list). Ctrl-C stops everything.\n"
    )
