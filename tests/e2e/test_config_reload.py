"""A real `slotshift controlplane` process reloads its config file on SIGHUP: a tenant's weight
changed and a tenant added in the file show in GetPoolConfig; an invalid file is refused, logged
with its problem, counted, and the running config kept; the process runs on."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from slotshift.v1 import admin_pb2, admin_pb2_grpc
from tests.e2e.service_processes import ServiceProcesses, grpc_serving, scrape, wait_ready
from tests.support import TEST_TENANT_KEYS, free_port, wait_until, wait_until_sync

pytestmark = pytest.mark.e2e


def _config(grpc_port: int, metrics_port: int, **tenant_b: Any) -> dict[str, Any]:
    return {
        "tenant_keys": TEST_TENANT_KEYS,
        "pools": [
            {
                "name": "default",
                "budget_slots": 12,
                "decision_period_s": 0.3,
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                    {"name": "B", "api_keys": ["key-b"], "floor_slots": 2, **tenant_b},
                ],
            }
        ],
        # No watch: only the signal reloads here.
        "controlplane": {
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            "config_reload_interval_s": 0,
            "state_store": {"kind": "memory"},
        },
    }


@pytest.fixture
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture
def services(tmp_path: Path, ports: tuple[int, int]) -> Iterator[ServiceProcesses]:
    processes = ServiceProcesses(tmp_path, _config(*ports))
    try:
        yield processes
    finally:
        processes.close()


async def test_sighup_reloads_the_file_and_keeps_it_on_error(
    services: ServiceProcesses, ports: tuple[int, int]
) -> None:
    grpc_port, metrics_port = ports
    target = f"127.0.0.1:{grpc_port}"
    services.start("controlplane", "controlplane")
    wait_ready(lambda: grpc_serving(target), "the control plane")

    def write(document: dict[str, Any]) -> None:
        services.config_path.write_text(yaml.safe_dump(services.stream_tokens.add_to(document)))

    def reloads(result: str) -> float:
        metrics = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        return metrics[f"slotshift_controlplane_config_reloads_total{{result={result}}}"]

    async with grpc.aio.insecure_channel(target) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)

        async def view() -> admin_pb2.PoolConfigView:
            return await admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default"))

        document = _config(grpc_port, metrics_port, weight=3.0)
        document["pools"][0]["tenants"].append({"name": "C", "api_keys": ["key-c"]})
        write(document)
        services.signal("controlplane", signal.SIGHUP)

        async def reloaded() -> bool:
            return {t.name: t.weight for t in (await view()).tenants} == {
                "A": 1.0,
                "B": 3.0,
                "C": 1.0,
            }

        await wait_until(reloaded, timeout_s=10, message="the reloaded tenants")
        assert (await view()).config_version == 2
        assert reloads("applied") == 1

        write(_config(grpc_port, metrics_port, floor_slots=20))  # floors above the budget
        services.signal("controlplane", signal.SIGHUP)
        wait_until_sync(lambda: reloads("invalid") == 1, timeout_s=10, message="the refusal")
        assert await reloaded(), "the running config is kept"
        assert (await view()).config_version == 2
    assert services.running("controlplane")
    log = services.log("controlplane")
    assert "config reload (SIGHUP): invalid: " in log and "floor_slots" in log, log[-2000:]
    assert "keeping the running config" in log
