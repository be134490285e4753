"""The processes under test, started as a user starts them, each with its log file.

- the upstream (`python -m slotshift_tools.gateway_bench.upstream`);
- a real control plane (`slotshift controlplane`) and one real gateway (`slotshift gateway`),
  from a generated config: one pool of the bench's tenants in front of the upstream, stream
  authentication on (generated tokens, StreamTokenFiles), tenants' keys under a generated
  key-digest secret, tracing as the environment configures it (nothing set here);
- for the price of token accounting (mix.py): two more gateways that differ only in
  `gateway.count_tokens` (`gateway-mix-counted`, `gateway-mix-uncounted`), each in front of a
  small pool of its own (`mix_pool`) of the same tenants and upstream, so that the two carry the
  mix at the same time without sharing slots;
- the bare TCP relay (`python -m slotshift_tools.gateway_bench.tcp_relay`), the floor under
  any Python proxy's cost, and the least relay on aiohttp
  (`python -m slotshift_tools.gateway_bench.aiohttp_relay`), the floor under a proxy built on
  aiohttp's server and client, as the gateway is, and the relay on asyncio protocols and llhttp
  (`python -m slotshift_tools.gateway_bench.protocol_relay`), the nearest step below aiohttp's
  server: what a gateway's data path without it would cost;
- HAProxy (`haproxy -f FILE -db`) with a static split equal to the tenants' nominal shares,
  when the binary is installed.

Each is ready when it answers: the upstream's /health, the control plane's gRPC health, and a
real request of every tenant through the gateway and through HAProxy (the gateway admits only
once the control plane has granted its limits).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from slotshift.apportion import nominal_shares
from slotshift.clock import Clock
from slotshift.config import parse_config
from slotshift_tools.gateway_bench.haproxy import find_haproxy, haproxy_config, tenants_of
from slotshift_tools.gateway_bench.upstream import MODEL
from slotshift_tools.local_stack import (
    STREAM_TOKENS_FOLDER,
    StreamTokenFiles,
    free_ports,
    generated_tenant_keys,
    grpc_serving,
)

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
POOL = "bench"
INTERACTIVE = "interactive"
BATCH = "batch"
PREEMPTIBLE = "preemptible"
TENANTS = (INTERACTIVE, BATCH, PREEMPTIBLE)
MIX_GATEWAYS = {"gateway-mix-counted": True, "gateway-mix-uncounted": False}
"""The accounting mix's gateways, and whether each counts tokens."""


def mix_pool(gateway: str) -> str:
    """The pool the accounting mix's `gateway` fronts (`mix-counted`, `mix-uncounted`)."""
    return gateway.removeprefix("gateway-")


READY_POLL_S = 0.1
STOP_GRACE_S = 10.0


class BenchProcessError(RuntimeError):
    """A process under test failed to start, or exited during the run."""


@dataclass(frozen=True)
class Targets:
    """The base URLs the client sends to, and each tenant's key."""

    direct: str
    gateway: str
    tcp_relay: str
    aiohttp_relay: str
    protocol_relay: str
    haproxy: str | None
    keys: dict[str, str]
    mix: dict[str, str]
    """The accounting mix's gateways (MIX_GATEWAYS), by name."""


def tenant_keys() -> dict[str, str]:
    """Each tenant's API key (a benchmark's throwaway keys, in clear in its config)."""
    return {name: f"bench-key-{name}" for name in TENANTS}


def stack_config_data(
    *,
    budget_slots: int,
    engine_port: int,
    grpc_port: int,
    metrics_port: int,
    gateway_port: int,
    keys: dict[str, str],
    mix_budget_slots: int = 12,
) -> dict[str, Any]:
    """The generated config: the bench's pool and the accounting mix's (`mix_pool`), each of the
    bench's tenants (the preemptible one preemptible), shipped defaults otherwise; stream auth
    and the key-digest secret are added by the caller."""

    def pool(name: str, budget: int) -> dict[str, Any]:
        return {
            "name": name,
            "budget_slots": budget,
            "engine_url": f"http://{HOST}:{engine_port}",
            "tenants": [
                {
                    "name": tenant,
                    "api_keys": [keys[tenant]],
                    **({"preemptible": True} if tenant == PREEMPTIBLE else {}),
                }
                for tenant in TENANTS
            ],
        }

    return {
        "pools": [
            pool(POOL, budget_slots),
            *(pool(mix_pool(name), mix_budget_slots) for name in MIX_GATEWAYS),
        ],
        "controlplane": {"grpc_host": HOST, "grpc_port": grpc_port, "metrics_port": metrics_port},
        "gateway": {
            "host": HOST,
            "port": gateway_port,
            "pool": POOL,
            "controlplane_target": f"{HOST}:{grpc_port}",
        },
    }


class BenchProcesses:
    """Starts the processes under test (module docstring) and stops them in reverse order."""

    def __init__(self, out_dir: Path, clock: Clock, *, ready_timeout_s: float = 60.0) -> None:
        self._out_dir = out_dir
        self._clock = clock
        self._ready_timeout_s = ready_timeout_s
        self._children: list[tuple[str, asyncio.subprocess.Process]] = []
        self.pids: dict[str, int] = {}
        """Each started process's pid, by role (upstream, controlplane, gateway, haproxy)."""
        self.haproxy_version: str | None = None

    async def start(
        self,
        *,
        budget_slots: int,
        events_per_s: float,
        with_haproxy: bool,
        mix_budget_slots: int = 12,
    ) -> Targets:
        """Start everything; the targets to measure. BenchProcessError when a process does not
        start or is not ready within the timeout. HAProxy is left out (targets.haproxy None)
        when `with_haproxy` is false or the binary is missing."""
        (
            engine,
            grpc_port,
            metrics_port,
            gateway_port,
            relay_port,
            aiohttp_relay_port,
            protocol_relay_port,
            haproxy_port,
            *mix_ports,
        ) = free_ports(8 + len(MIX_GATEWAYS))
        keys = tenant_keys()
        data = stack_config_data(
            budget_slots=budget_slots,
            engine_port=engine,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            gateway_port=gateway_port,
            keys=keys,
            mix_budget_slots=mix_budget_slots,
        )
        data["tenant_keys"] = await asyncio.to_thread(generated_tenant_keys, self._out_dir)
        tokens = await asyncio.to_thread(
            StreamTokenFiles.ensure, self._out_dir / STREAM_TOKENS_FOLDER
        )
        data["controlplane"]["stream_auth"] = {
            "gateway_token_file": str(tokens.gateway),
            "agent_token_file": str(tokens.agent),
        }
        data["gateway"]["controlplane_token_file"] = str(tokens.gateway)
        pool = parse_config(data, source="bench-gateway").pool(POOL)
        config_path = self._out_dir / "slotshift.yaml"
        await asyncio.to_thread(_write_text, config_path, yaml.safe_dump(data, sort_keys=False))

        direct = f"http://{HOST}:{engine}"
        await self._spawn(
            "upstream",
            [
                sys.executable,
                "-m",
                "slotshift_tools.gateway_bench.upstream",
                "--port",
                str(engine),
                "--events-per-s",
                str(events_per_s),
            ],
        )
        await self._wait("upstream", lambda: _http_ok(f"{direct}/health"))
        await self._spawn("controlplane", _service_argv("controlplane", config_path))
        await self._wait("controlplane", lambda: grpc_serving(f"{HOST}:{grpc_port}"))
        gateway = f"http://{HOST}:{gateway_port}"
        await self._spawn(
            "gateway",
            [
                *_service_argv("gateway", config_path),
                "--gateway-id",
                "bench-gateway",
                "--port",
                str(gateway_port),
            ],
        )
        await self._wait("gateway", lambda: _every_tenant_served(gateway, keys))
        mix = {}
        for (name, counting), port in zip(MIX_GATEWAYS.items(), mix_ports, strict=True):
            mix_data = {
                **data,
                "gateway": {**data["gateway"], "pool": mix_pool(name), "count_tokens": counting},
            }
            mix_path = self._out_dir / f"slotshift-{name}.yaml"
            await asyncio.to_thread(
                _write_text, mix_path, yaml.safe_dump(mix_data, sort_keys=False)
            )
            await self._spawn(
                name,
                [*_service_argv("gateway", mix_path), "--gateway-id", name, "--port", str(port)],
            )
            mix[name] = f"http://{HOST}:{port}"
        for name, url in mix.items():
            await self._wait(name, partial(_every_tenant_served, url, keys))
        tcp_relay = f"http://{HOST}:{relay_port}"
        await self._spawn(
            "tcp-relay",
            [
                sys.executable,
                "-m",
                "slotshift_tools.gateway_bench.tcp_relay",
                "--port",
                str(relay_port),
                "--upstream-port",
                str(engine),
            ],
        )
        await self._wait("tcp-relay", partial(_every_tenant_served, tcp_relay, keys))
        aiohttp_relay = f"http://{HOST}:{aiohttp_relay_port}"
        await self._spawn(
            "aiohttp-relay",
            [
                sys.executable,
                "-m",
                "slotshift_tools.gateway_bench.aiohttp_relay",
                "--port",
                str(aiohttp_relay_port),
                "--upstream-port",
                str(engine),
            ],
        )
        await self._wait("aiohttp-relay", partial(_every_tenant_served, aiohttp_relay, keys))
        protocol_relay = f"http://{HOST}:{protocol_relay_port}"
        await self._spawn(
            "protocol-relay",
            [
                sys.executable,
                "-m",
                "slotshift_tools.gateway_bench.protocol_relay",
                "--port",
                str(protocol_relay_port),
                "--upstream-port",
                str(engine),
                *(f"--tenant-key={name}={key}" for name, key in keys.items()),
            ],
        )
        await self._wait("protocol-relay", partial(_every_tenant_served, protocol_relay, keys))

        haproxy_url: str | None = None
        binary = find_haproxy() if with_haproxy else None
        if binary is not None:
            self.haproxy_version = await asyncio.to_thread(_haproxy_version, binary)
            text = haproxy_config(
                bind_host=HOST,
                bind_port=haproxy_port,
                engine_host=HOST,
                engine_port=engine,
                tenants=tenants_of(keys, nominal_shares(pool)),
            )
            haproxy_path = self._out_dir / "haproxy.cfg"
            await asyncio.to_thread(_write_text, haproxy_path, text)
            haproxy_url = f"http://{HOST}:{haproxy_port}"
            await self._spawn("haproxy", [binary, "-f", str(haproxy_path), "-db"])
            url = haproxy_url
            await self._wait("haproxy", lambda: _every_tenant_served(url, keys))
        return Targets(
            direct=direct,
            gateway=gateway,
            tcp_relay=tcp_relay,
            aiohttp_relay=aiohttp_relay,
            protocol_relay=protocol_relay,
            haproxy=haproxy_url,
            keys=keys,
            mix=mix,
        )

    def check_alive(self) -> None:
        """BenchProcessError when a process under test has exited."""
        for name, process in self._children:
            if process.returncode is not None:
                raise BenchProcessError(
                    f"{name} exited with status {process.returncode} during the run "
                    f"(see {self._out_dir / (name + '.log')})"
                )

    async def stop(self) -> None:
        """SIGTERM each process in reverse start order, SIGKILL after a grace period."""
        for name, process in reversed(self._children):
            if process.returncode is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
            except TimeoutError:
                logger.warning("%s did not stop within %.0f s; killing it", name, STOP_GRACE_S)
                process.kill()
                await process.wait()

    async def _spawn(self, name: str, argv: Sequence[str]) -> None:
        log = await asyncio.to_thread((self._out_dir / f"{name}.log").open, "wb")
        with log:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True
            )
        self._children.append((name, process))
        self.pids[name] = process.pid

    async def _wait(self, name: str, ready: Any) -> None:
        deadline = self._clock.monotonic() + self._ready_timeout_s
        process = dict(self._children)[name]
        while not await ready():
            if process.returncode is not None:
                raise BenchProcessError(
                    f"{name} exited with status {process.returncode} while starting "
                    f"(see {self._out_dir / (name + '.log')})"
                )
            if self._clock.monotonic() > deadline:
                raise BenchProcessError(f"{name} was not ready within {self._ready_timeout_s} s")
            await asyncio.sleep(READY_POLL_S)
        logger.info("%s is ready (pid %d)", name, process.pid)


def _service_argv(service: str, config_path: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "slotshift_tools",
        service,
        "--config",
        str(config_path),
        "--log-level",
        "WARNING",
    ]


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _haproxy_version(binary: str) -> str:
    result = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    first = result.stdout.splitlines()[0] if result.stdout else ""
    return first.strip() or "unknown"


async def _http_ok(url: str) -> bool:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session,
            session.get(url) as response,
        ):
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _every_tenant_served(base_url: str, keys: dict[str, str]) -> bool:
    """Whether a small completion of every tenant through `base_url` answers 200."""
    body = {"model": MODEL, "prompt": "ready", "max_tokens": 1}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            for key in keys.values():
                async with session.post(
                    f"{base_url}/v1/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                ) as response:
                    await response.read()
                    if response.status != 200:
                        return False
    except (aiohttp.ClientError, TimeoutError):
        return False
    return True
