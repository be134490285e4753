"""What each slotshift service listens on, by the config it reads: the facts that Services,
probes, compose ports and health checks must agree with.

The paths are those the services' HTTP apps register (controlplane/server.py,
admission_gateway/gateway.py and proxy.py, telemetry_agent/http_server.py, engine_sim/server.py).
"""

from __future__ import annotations

from slotshift.config import SlotshiftConfig

OPENAI_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models"})


def http_paths(subcommand: str, config: SlotshiftConfig) -> dict[int, frozenset[str]]:
    """The HTTP paths the service serves, by port."""
    if subcommand == "controlplane":
        return {config.controlplane.metrics_port: frozenset({"/health", "/metrics"})}
    if subcommand == "gateway":
        return {config.gateway.port: OPENAI_PATHS | {"/health", "/ready", "/metrics"}}
    if subcommand == "agent":
        return {config.agent.metrics_port: frozenset({"/health", "/metrics"})}
    if subcommand == "engine-sim":
        return {config.engine_sim.port: OPENAI_PATHS | {"/health", "/version", "/metrics"}}
    raise AssertionError(f"no listeners known for `slotshift {subcommand}`")


def grpc_ports(subcommand: str, config: SlotshiftConfig) -> frozenset[int]:
    """The ports where the service speaks gRPC (with grpc.health.v1)."""
    if subcommand == "controlplane":
        return frozenset({config.controlplane.grpc_port})
    return frozenset()


def ports(subcommand: str, config: SlotshiftConfig) -> frozenset[int]:
    """Every port the service listens on."""
    return frozenset(http_paths(subcommand, config)) | grpc_ports(subcommand, config)


def bind_host(subcommand: str, config: SlotshiftConfig) -> str:
    """The address the service binds."""
    hosts = {
        "controlplane": config.controlplane.grpc_host,
        "gateway": config.gateway.host,
        "agent": config.agent.host,
        "engine-sim": config.engine_sim.host,
    }
    return hosts[subcommand]
