"""End to end, real processes: a config that loads but that a service refuses as it starts (the
streams without credentials, a secret's file missing) ends `slotshift <service>` with status 2
and one line on stderr naming the field at fault, as a config the loader refuses does; no
traceback, and no error logged on the way out (nothing the failed start opened is left
behind)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.service_processes import ROOT

pytestmark = pytest.mark.e2e

MISSING = "no-such-file"


def _config(**sections: dict[str, Any]) -> dict[str, Any]:
    """A config every loader takes (nothing is read at load time but what it names), with
    `sections` merged into its sections. The streams are open unless a section says otherwise:
    each case breaks one thing only."""
    config: dict[str, Any] = {
        "pools": [
            {
                "name": "default",
                "budget_slots": 4,
                "engine_url": "http://127.0.0.1:1",
                "tenants": [{"name": "A", "api_keys": ["key-a"]}],
            }
        ],
        "tenant_keys": {"unkeyed_key_digests": True},
        "controlplane": {
            "grpc_port": 0,
            "metrics_port": 0,
            "state_store": {"kind": "memory"},
            "stream_auth": {"insecure_allow_unauthenticated": True},
        },
        "gateway": {"port": 0, "controlplane_target": "127.0.0.1:1"},
        "agent": {
            "controlplane_target": "127.0.0.1:1",
            "engine_metrics_url": "http://127.0.0.1:1/metrics",
            "metrics_port": 0,
        },
        "engine_sim": {"port": 0},
    }
    for name, fields in sections.items():
        config[name] = {**config[name], **fields}
    return config


CASES = [
    pytest.param(
        "controlplane",
        _config(controlplane={"grpc_port": 0, "metrics_port": 0, "stream_auth": {}}),
        "controlplane.stream_auth: no credentials for the gateway and agent streams",
        id="controlplane-without-stream-credentials",
    ),
    pytest.param(
        "controlplane",
        _config(controlplane={"query_token_file": MISSING}),
        "controlplane.query_token_file: cannot read",
        id="controlplane-query-token-missing",
    ),
    pytest.param(
        "controlplane",
        _config(controlplane={"admin_token_file": MISSING}),
        "controlplane.admin_token_file: cannot read",
        id="controlplane-admin-token-missing",
    ),
    pytest.param(
        "gateway",
        _config(gateway={"metrics_token_file": MISSING}),
        "gateway.metrics_token_file: cannot read",
        id="gateway-metrics-token-missing",
    ),
    pytest.param(
        "agent",
        _config(agent={"metrics_token_file": MISSING}),
        "agent.metrics_token_file: cannot read",
        id="agent-metrics-token-missing",
    ),
    pytest.param(
        "agent",
        _config(agent={"pool": "elsewhere"}),
        "agent: pool(s) 'elsewhere' of the watched engines are not configured pools",
        id="agent-pool-unknown",
    ),
    pytest.param(
        "engine-sim",
        _config(engine_sim={"api_key_file": MISSING}),
        "engine_sim.api_key_file: cannot read",
        id="engine-sim-key-missing",
    ),
]


@pytest.mark.parametrize(("command", "config", "error"), CASES)
def test_a_config_refused_at_start_is_one_line_and_status_2(
    tmp_path: Path, command: str, config: dict[str, Any], error: str
) -> None:
    path = tmp_path / "slotshift.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "slotshift_tools", command, "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"slotshift {command}: invalid configuration: {error}"), lines
    assert "Traceback" not in result.stderr
    assert not [line for line in lines if " ERROR " in line], lines
