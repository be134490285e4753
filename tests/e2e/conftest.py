"""End-to-end fixtures: the local stack started as a user starts it (`slotshift up`), on free
ports, as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.service_processes import grpc_serving, http_ok
from tests.support import free_port, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "deploy" / "local" / "slotshift.yaml"


@dataclass
class RunningStack:
    process: subprocess.Popen[bytes]
    log: Path
    grpc_target: str
    gateway_urls: list[str]
    engine_url: str
    decision_period_s: float
    controlplane_metrics_url: str
    agent_metrics_url: str

    @property
    def metrics_urls(self) -> dict[str, str]:
        """Every service's Prometheus endpoint, by service."""
        return {
            "controlplane": self.controlplane_metrics_url,
            "gateway-0": f"{self.gateway_urls[0]}/metrics",
            "gateway-1": f"{self.gateway_urls[1]}/metrics",
            "agent": self.agent_metrics_url,
            "engine": f"{self.engine_url}/metrics",
        }

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def running_stack(
    log_dir: Path,
    *,
    environment: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    period_s: float = 1.0,
) -> Iterator[RunningStack]:
    """`slotshift up` on free ports, with extra environment variables and config overrides;
    ready when it yields, stopped (and checked to stop cleanly) after."""
    engine, cp, cp_metrics, agent_metrics, gw0, gw1 = (free_port() for _ in range(6))
    settings: dict[str, object] = {
        "engine_sim.port": engine,
        "pools.0.engine_url": f"http://127.0.0.1:{engine}",
        "pools.0.decision_period_s": period_s,
        "controlplane.grpc_port": cp,
        "controlplane.metrics_port": cp_metrics,
        "gateway.controlplane_target": f"127.0.0.1:{cp}",
        "agent.controlplane_target": f"127.0.0.1:{cp}",
        "agent.engine_metrics_url": f"http://127.0.0.1:{engine}/metrics",
        "agent.metrics_port": agent_metrics,
        "local_stack.gateway_ports": f"[{gw0}, {gw1}]",
        **(overrides or {}),
    }
    command = [sys.executable, "-m", "slotshift", "up", "--config", str(DEMO_CONFIG)]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    log = log_dir / "slotshift-up.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(environment or {})},
        )
    stack = RunningStack(
        process=process,
        log=log,
        grpc_target=f"127.0.0.1:{cp}",
        gateway_urls=[f"http://127.0.0.1:{gw0}", f"http://127.0.0.1:{gw1}"],
        engine_url=f"http://127.0.0.1:{engine}",
        decision_period_s=period_s,
        controlplane_metrics_url=f"http://127.0.0.1:{cp_metrics}/metrics",
        agent_metrics_url=f"http://127.0.0.1:{agent_metrics}/metrics",
    )
    try:
        wait_until_sync(
            lambda: (
                process.poll() is not None
                or (
                    grpc_serving(stack.grpc_target)
                    and all(http_ok(f"{url}/ready") for url in stack.gateway_urls)
                    and http_ok(f"http://127.0.0.1:{agent_metrics}/health")
                )
            ),
            timeout_s=60,
            message="the local stack to become ready",
        )
        assert process.poll() is None, f"slotshift up exited early:\n{stack.log_tail()}"
        yield stack
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, f"slotshift up did not stop cleanly:\n{stack.log_tail()}"


@pytest.fixture(scope="module")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """The local stack as the demo config describes it, one per test module."""
    with running_stack(tmp_path_factory.mktemp("stack")) as stack:
        yield stack
