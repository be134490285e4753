"""deploy/compose: a valid compose file whose services agree with the config they read.

Validated against the Compose Specification's JSON schema (vendored by the PyPI package
check-jsonschema, so offline) and, where a docker compose is installed, by `docker compose config`.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from slotshift.config import SlotshiftConfig, load_config, parse_config
from slotshift_tools.cli import build_parser
from tests.deploy import listeners

REPO = Path(__file__).parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
SECRETS_DIR = PurePosixPath("/run/secrets")
# A file the validators must reject: a misspelt key and a port that is not one.
BROKEN_COMPOSE = (
    "services:\n  web:\n    image: nginx\n    prots: ['80']\n    ports: [{target: http}]\n"
)

Service = dict[str, Any]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return document


def _slotshift_services(compose: dict[str, Any]) -> Iterator[tuple[str, Service]]:
    for name, service in compose["services"].items():
        if service["image"].split(":")[0] == "slotshift":
            yield name, service


def _running(compose: dict[str, Any], subcommand: str) -> list[str]:
    return [n for n, s in _slotshift_services(compose) if s["command"][0] == subcommand]


def _files_seen_by(compose: dict[str, Any], service: Service) -> dict[PurePosixPath, Path]:
    """Container path -> host file, for bind mounts and secrets."""
    files: dict[PurePosixPath, Path] = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        files[PurePosixPath(target)] = COMPOSE_DIR / source
    for secret in service.get("secrets", []):
        files[SECRETS_DIR / secret] = COMPOSE_DIR / compose["secrets"][secret]["file"]
    return files


def _config_path(service: Service) -> PurePosixPath:
    return PurePosixPath(build_parser().parse_args(service["command"]).config)


def _config(compose: dict[str, Any], service: Service) -> SlotshiftConfig:
    files = _files_seen_by(compose, service)
    path = _config_path(service)
    assert path in files, f"--config {path} is not mounted"
    return parse_config(yaml.safe_load(files[path].read_text()), source=str(files[path]))


@pytest.fixture(scope="module")
def config(compose: dict[str, Any]) -> SlotshiftConfig:
    configs = [_config(compose, s) for _, s in _slotshift_services(compose)]
    assert all(c == configs[0] for c in configs), "services read different configs"
    return configs[0]


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_compose_file_follows_the_compose_specification(tmp_path: Path) -> None:
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema (which ships the compose-spec schema) is not installed")
    broken = tmp_path / "compose.yaml"
    broken.write_text(BROKEN_COMPOSE)
    assert _check_jsonschema(broken).returncode != 0, "the schema check accepts a broken file"

    done = _check_jsonschema(COMPOSE_FILE)

    assert done.returncode == 0, done.stdout + done.stderr


def _docker_compose() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run(
            [docker, "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    return [standalone] if standalone else None


def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    tool = _docker_compose()
    if tool is None:
        pytest.skip("no docker compose here (it validates without an engine where installed)")
    broken = tmp_path / "compose.yaml"
    broken.write_text(BROKEN_COMPOSE)
    rejects = subprocess.run(
        [*tool, "-f", str(broken), "config", "-q"], capture_output=True, check=False
    )
    if rejects.returncode == 0:
        pytest.skip(f"{tool} accepts a broken file: not a usable validator")

    done = subprocess.run(
        [*tool, "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )

    assert done.returncode == 0, done.stderr


def test_the_topology_is_the_clusters(compose: dict[str, Any]) -> None:
    commands = sorted(s["command"][0] for _, s in _slotshift_services(compose))

    assert commands == ["agent", "controlplane", "engine-sim", "gateway", "gateway"]
    assert any(s["image"].startswith("jaegertracing/") for s in compose["services"].values())


def test_every_slotshift_command_is_a_valid_cli_invocation(compose: dict[str, Any]) -> None:
    for name, service in _slotshift_services(compose):
        try:
            build_parser().parse_args(service["command"])
        except SystemExit:
            pytest.fail(f"{name}: `slotshift {service['command']}` is invalid")


def test_the_image_is_built_from_the_repository_dockerfile(compose: dict[str, Any]) -> None:
    for _, service in _slotshift_services(compose):
        context = (COMPOSE_DIR / service["build"]["context"]).resolve()
        assert context == REPO
        assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file()


def test_every_server_binds_all_addresses(compose: dict[str, Any], config: SlotshiftConfig) -> None:
    for _, service in _slotshift_services(compose):
        assert listeners.bind_host(service["command"][0], config) == "0.0.0.0"


def test_published_ports_are_ports_the_services_open(
    compose: dict[str, Any], config: SlotshiftConfig
) -> None:
    published = []
    for name, service in _slotshift_services(compose):
        opened = listeners.ports(service["command"][0], config)
        for mapping in service["ports"]:
            host_ip, host_port, container_port = mapping.split(":")
            assert int(container_port) in opened, f"{name} publishes {mapping}"
            assert host_ip == "127.0.0.1", f"{name} publishes {mapping} beyond this host"
            published.append(int(host_port))

    assert len(published) == len(set(published)), "two services publish one host port"


def test_healthchecks_ask_for_served_health_paths(
    compose: dict[str, Any], config: SlotshiftConfig
) -> None:
    for name, service in _slotshift_services(compose):
        served = listeners.http_paths(service["command"][0], config)
        urls = re.findall(
            r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", " ".join(service["healthcheck"]["test"])
        )
        assert len(urls) == 1, f"{name}: {service['healthcheck']['test']}"
        port, path = urls[0]
        assert path in served[int(port)] - listeners.OPENAI_PATHS, f"{name}: {path} on {port}"
    gateways = [compose["services"][n] for n in _running(compose, "gateway")]
    assert all("/ready" in " ".join(g["healthcheck"]["test"]) for g in gateways)


def test_peers_in_the_config_are_compose_services(
    compose: dict[str, Any], config: SlotshiftConfig
) -> None:
    (controlplane,) = _running(compose, "controlplane")
    (engine,) = _running(compose, "engine-sim")

    for target in (config.gateway.controlplane_target, config.agent.controlplane_target):
        assert target == f"{controlplane}:{config.controlplane.grpc_port}"
    engine_url = urlsplit(config.pool(config.gateway.pool).engine_url)
    assert (engine_url.hostname, engine_url.port) == (engine, config.engine_sim.port)
    metrics = urlsplit(config.agent.engine_metrics_url)
    assert (metrics.hostname, metrics.port, metrics.path) == (
        engine,
        config.engine_sim.port,
        "/metrics",
    )


def test_traces_go_to_the_jaeger_service(compose: dict[str, Any]) -> None:
    names = set()
    for subcommand in ("controlplane", "gateway", "agent"):
        for name in _running(compose, subcommand):
            environment = compose["services"][name]["environment"]
            endpoint = urlsplit(environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
            jaeger = compose["services"][endpoint.hostname]
            assert jaeger["image"].startswith("jaegertracing/all-in-one:")
            assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
            assert endpoint.port == 4317
            names.add(environment["OTEL_SERVICE_NAME"])

    assert names == {"slotshift-controlplane", "slotshift-gateway", "slotshift-agent"}


def test_the_gateways_match_the_fallback_split(
    compose: dict[str, Any], config: SlotshiftConfig
) -> None:
    gateways = _running(compose, "gateway")
    ids = {compose["services"][n]["environment"]["SLOTSHIFT_GATEWAY_ID"] for n in gateways}

    assert len(gateways) == len(ids) == config.gateway.fallback_replicas


def test_services_start_after_what_they_need(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for needed, condition in service.get("depends_on", {}).items():
            assert needed in compose["services"], f"{name} depends on unknown {needed}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in compose["services"][needed], f"{needed} has no healthcheck"


def test_tenant_key_files_are_compose_secrets(compose: dict[str, Any], tmp_path: Path) -> None:
    for name, service in _slotshift_services(compose):
        files = _files_seen_by(compose, service)
        document = yaml.safe_load(files[_config_path(service)].read_text())
        for pool in document["pools"]:
            for tenant in pool["tenants"]:
                key_file = PurePosixPath(tenant["api_keys_file"])
                assert key_file.parent == SECRETS_DIR, f"{name}: {key_file} is not a secret"
                assert key_file in files, f"{name}: {key_file} is not mounted"
                tenant["api_keys_file"] = str(files[key_file])
        secret_file = PurePosixPath(document["tenant_keys"]["key_digest_secret_file"])
        assert secret_file.parent == SECRETS_DIR, f"{name}: {secret_file} is not a secret"
        assert secret_file in files, f"{name}: {secret_file} is not mounted"
        document["tenant_keys"]["key_digest_secret_file"] = str(files[secret_file])
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(document))

        loaded = load_config(tmp_path / f"{name}.yaml")

        keys = [k.get_secret_value() for p in loaded.pools for t in p.tenants for k in t.api_keys]
        assert keys
        assert len(set(keys)) == len(keys)


def test_each_role_gets_its_own_stream_token_and_the_control_plane_both(
    compose: dict[str, Any],
) -> None:
    wanted = {
        "controlplane": {"gateway-stream-token", "agent-stream-token"},
        "gateway": {"gateway-stream-token"},
        "agent": {"agent-stream-token"},
    }
    for name, service in _slotshift_services(compose):
        role = service["command"][0]
        secrets = {s for s in service.get("secrets", []) if s.endswith("-stream-token")}
        assert secrets == wanted.get(role, set()), name
        config = _config(compose, service)
        auth = config.controlplane.stream_auth
        named = {
            "controlplane": [auth.gateway_token_file, auth.agent_token_file],
            "gateway": [config.gateway.controlplane_token_file],
            "agent": [config.agent.controlplane_token_file],
        }.get(role, [])
        assert {PurePosixPath(p).name for p in named if p is not None} == secrets, name


@pytest.mark.parametrize(
    ("secret", "field"),
    [("admin-token", "admin_token_file"), ("query-token", "query_token_file")],
    ids=["admin-token", "query-token"],
)
def test_only_the_control_plane_gets_its_api_tokens_and_reads_them(
    compose: dict[str, Any], secret: str, field: str
) -> None:
    for name, service in _slotshift_services(compose):
        has_token = secret in service.get("secrets", [])
        assert has_token == (service["command"][0] == "controlplane"), name
        if not has_token:
            continue
        named = getattr(_config(compose, service).controlplane, field)
        assert named is not None, f"{name}: {field} is not set"
        files = _files_seen_by(compose, service)
        path = PurePosixPath(named)
        assert path == PurePosixPath("/run/secrets") / secret, f"{name}: {field} is {path}"
        assert files[path].read_text().strip(), f"{path} holds no token"


def test_services_run_unprivileged_on_a_read_only_root(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert "/tmp" in service["tmpfs"], name
    for name, service in _slotshift_services(compose):
        assert service["user"] == "10001:10001", name
