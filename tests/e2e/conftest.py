"""End-to-end fixtures: the local stack started as a user starts it (`slotshift up`), on free
ports, as real processes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.service_processes import grpc_serving, http_ok, log_tail, slotshift_up
from tests.support import free_port

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
        return log_tail(self.log, lines)


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
        # Each stack its own state: not the demo's, beside deploy/local/slotshift.yaml.
        "controlplane.state_store.sqlite_file": str(log_dir / "state.sqlite3"),
        **(overrides or {}),
    }
    gateway_urls = [f"http://127.0.0.1:{gw0}", f"http://127.0.0.1:{gw1}"]

    def ready() -> bool:
        return (
            grpc_serving(f"127.0.0.1:{cp}")
            and all(http_ok(f"{url}/ready") for url in gateway_urls)
            and http_ok(f"http://127.0.0.1:{agent_metrics}/health")
        )

    log = log_dir / "slotshift-up.log"
    with slotshift_up(
        log,
        config=DEMO_CONFIG,
        settings=settings,
        ready=ready,
        ready_timeout_s=60,
        stop_timeout_s=60,
        environment=environment,
    ) as process:
        yield RunningStack(
            process=process,
            log=log,
            grpc_target=f"127.0.0.1:{cp}",
            gateway_urls=gateway_urls,
            engine_url=f"http://127.0.0.1:{engine}",
            decision_period_s=period_s,
            controlplane_metrics_url=f"http://127.0.0.1:{cp_metrics}/metrics",
            agent_metrics_url=f"http://127.0.0.1:{agent_metrics}/metrics",
        )


@pytest.fixture(scope="module")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """The local stack as the demo config describes it, one per test module."""
    with running_stack(tmp_path_factory.mktemp("stack")) as stack:
        yield stack
