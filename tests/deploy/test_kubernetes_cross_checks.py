"""The rendered manifests agree with what the services read and serve.

The config checked is the one in the ConfigMap, as the pods see it; ports, paths, key files and
commands are checked against that config, the CLI's parser and the services' listeners.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from slotshift.config import SlotshiftConfig, load_config, parse_config
from slotshift_tools.cli import build_parser
from tests.deploy import listeners
from tests.deploy.manifests import (
    KUBERNETES_DIR,
    Manifests,
    Obj,
    container_port,
    env_of,
    image_name,
    pod_spec,
)

SLOTSHIFT_SERVICES = ("controlplane", "gateway", "agent")
RUN_AS_USER = 10001


@pytest.fixture
def h200(renders: dict[Path, Manifests]) -> Manifests:
    return renders[KUBERNETES_DIR / "overlays" / "h200-vllm"]


@pytest.fixture
def emulator(renders: dict[Path, Manifests]) -> Manifests:
    return renders[KUBERNETES_DIR / "overlays" / "emulator"]


def _config_path(container: Obj) -> PurePosixPath:
    args = build_parser().parse_args(container["args"])
    return PurePosixPath(args.config)


def _config_seen_by(manifests: Manifests, workload: Obj, container: Obj) -> SlotshiftConfig:
    files = manifests.files_seen_by(workload, container)
    path = _config_path(container)
    assert path in files, f"{container['name']}: --config {path} is not a mounted file"
    return parse_config(yaml.safe_load(files[path]), source=f"{container['name']}:{path}")


def _config(manifests: Manifests) -> SlotshiftConfig:
    """The config every slotshift container reads: one, the same for all."""
    configs = [_config_seen_by(manifests, w, c) for w, c in manifests.slotshift_containers()]
    assert configs
    assert all(c == configs[0] for c in configs), "slotshift containers read different configs"
    return configs[0]


def _effective_security(workload: Obj, container: Obj) -> dict[str, Any]:
    """The container's security settings with the pod's defaults filled in."""
    pod = pod_spec(workload).get("securityContext", {})
    own = container.get("securityContext", {})
    return {key: own.get(key, pod.get(key)) for key in {*pod, *own} - {"fsGroup"}}


def test_every_slotshift_command_is_a_valid_cli_invocation(overlay: Manifests) -> None:
    commands = []
    for workload, container in overlay.slotshift_containers():
        assert "command" not in container, "the image's entrypoint is `slotshift`; set args only"
        try:
            args = build_parser().parse_args(container["args"])
        except SystemExit:
            pytest.fail(
                f"{workload['metadata']['name']}: `slotshift {container['args']}` is invalid"
            )
        commands.append(args.command)

    # Each service once; the emulator only where it stands in for vLLM.
    assert sorted(set(commands)) == sorted(commands)
    assert set(commands) - {"engine-sim"} == set(SLOTSHIFT_SERVICES)


def test_every_slotshift_container_reads_the_same_valid_config(overlay: Manifests) -> None:
    config = _config(overlay)

    (engine,) = config.agent.watched_engines
    assert config.pool(config.gateway.pool) == config.pool(engine.pool)


def test_every_server_binds_all_addresses(overlay: Manifests) -> None:
    config = _config(overlay)

    for _, container in overlay.slotshift_containers():
        command = container["args"][0]
        assert listeners.bind_host(command, config) == "0.0.0.0", command


def test_container_ports_are_the_ports_the_config_opens(overlay: Manifests) -> None:
    config = _config(overlay)

    for _, container in overlay.slotshift_containers():
        declared = {p["containerPort"] for p in container["ports"]}
        assert declared == listeners.ports(container["args"][0], config), container["name"]


def test_probes_hit_ports_and_paths_the_services_serve(overlay: Manifests) -> None:
    config = _config(overlay)

    for _, container in overlay.slotshift_containers():
        command = container["args"][0]
        served = listeners.http_paths(command, config)
        probes = [
            container[kind]
            for kind in ("startupProbe", "livenessProbe", "readinessProbe")
            if kind in container
        ]
        assert {"livenessProbe", "readinessProbe"} <= container.keys(), command
        for probe in probes:
            if "grpc" in probe:
                assert probe["grpc"]["port"] in listeners.grpc_ports(command, config), command
                continue
            port = container_port(container, probe["httpGet"]["port"])
            assert probe["httpGet"]["path"] in served[port] - listeners.OPENAI_PATHS, (
                f"{command}: probe {probe['httpGet']} is not a health endpoint it serves"
            )


def test_the_probes_are_grpc_health_for_the_control_plane_and_http_for_the_gateway(
    overlay: Manifests,
) -> None:
    config = _config(overlay)
    _, controlplane = overlay.workload_running("controlplane")
    _, gateway = overlay.workload_running("gateway")

    assert controlplane["livenessProbe"]["grpc"] == {"port": config.controlplane.grpc_port}
    assert controlplane["readinessProbe"]["grpc"] == {"port": config.controlplane.grpc_port}
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_metrics_annotations_name_a_metrics_endpoint(overlay: Manifests) -> None:
    config = _config(overlay)

    for workload, _ in overlay.slotshift_containers():
        # A pod's annotations name one port: a container of the pod must open it, and serve the
        # path when it is a slotshift one (the engine pod's annotations are vLLM's /metrics).
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        port = int(annotations["prometheus.io/port"])
        (opener,) = [
            c
            for c in pod_spec(workload)["containers"]
            if port in {p["containerPort"] for p in c.get("ports", [])}
        ]
        assert annotations["prometheus.io/path"] == "/metrics"
        if image_name(opener["image"]) == "slotshift":
            served = listeners.http_paths(opener["args"][0], config)
            assert annotations["prometheus.io/path"] in served[port]


def test_every_service_selects_one_workload_and_targets_its_ports(overlay: Manifests) -> None:
    for service in overlay.of_kind("Service"):
        selected = overlay.workloads_selected_by(service)
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {selected}"
        containers = pod_spec(selected[0])["containers"]
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            opened = set()
            for container in containers:
                if isinstance(target, str) and not any(
                    p.get("name") == target for p in container.get("ports", [])
                ):
                    continue
                opened.add(container_port(container, target))
            assert opened, f"Service {service['metadata']['name']} targets {target}: no such port"
            # One number per port everywhere: what the config and the clients name is what opens.
            assert opened == {port["port"]}, f"Service {service['metadata']['name']}: {port}"


def test_peers_in_the_config_are_services_on_the_right_ports(overlay: Manifests) -> None:
    config = _config(overlay)
    controlplane, _ = overlay.workload_running("controlplane")

    for target in (config.gateway.controlplane_target, config.agent.controlplane_target):
        host, _, port = target.rpartition(":")
        service, service_port = overlay.service_at(host, int(port))
        assert overlay.workloads_selected_by(service) == [controlplane]
        (opened,) = {
            container_port(c, service_port["targetPort"])
            for c in pod_spec(controlplane)["containers"]
        }
        assert opened == config.controlplane.grpc_port


def test_the_agent_scrapes_the_engine_of_its_own_pod(overlay: Manifests) -> None:
    config = _config(overlay)
    pool = config.pool(config.gateway.pool)
    engine = urlsplit(pool.engine_url)
    assert engine.hostname is not None
    assert engine.port is not None
    service, service_port = overlay.service_at(engine.hostname, engine.port)
    (engine_pod,) = overlay.workloads_selected_by(service)
    agent_pod, _ = overlay.workload_running("agent")
    (watched,) = config.agent.watched_engines
    metrics = urlsplit(watched.metrics_url)

    # A sidecar: each replica's agent watches the engine beside it, never one the Service picks.
    assert agent_pod == engine_pod
    assert watched.pool == pool.name
    assert (metrics.hostname, metrics.path) == ("127.0.0.1", "/metrics")
    assert metrics.port == engine.port
    (engine_container,) = [
        c
        for c in pod_spec(engine_pod)["containers"]
        if any(p.get("name") == service_port["targetPort"] for p in c.get("ports", []))
    ]
    assert container_port(engine_container, service_port["targetPort"]) == metrics.port
    assert "/metrics" in _engine_http_paths(engine_container, config)[metrics.port]


def _engine_http_paths(container: Obj, config: SlotshiftConfig) -> dict[int, frozenset[str]]:
    if image_name(container["image"]) == "slotshift":
        return listeners.http_paths(container["args"][0], config)
    # vLLM's OpenAI server: the API, /health and /metrics on its --port.
    port = int(_flag(container["args"], "--port"))
    return {port: listeners.OPENAI_PATHS | {"/health", "/metrics"}}


def test_the_gateway_replicas_match_the_fallback_split(overlay: Manifests) -> None:
    config = _config(overlay)
    gateway, container = overlay.workload_running("gateway")

    assert gateway["kind"] == "Deployment"
    assert gateway["spec"]["replicas"] == config.gateway.fallback_replicas == 2
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    assert env_of(container)["SLOTSHIFT_GATEWAY_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }


def test_one_control_plane_at_a_time(overlay: Manifests) -> None:
    controlplane, _ = overlay.workload_running("controlplane")

    assert controlplane["spec"]["replicas"] == 1
    assert controlplane["spec"]["strategy"] == {"type": "Recreate"}


def test_every_tenant_key_file_is_a_mounted_secret_key(overlay: Manifests, tmp_path: Path) -> None:
    secret_names = {s["metadata"]["name"] for s in overlay.of_kind("Secret")}
    for workload, container in overlay.slotshift_containers():
        files = overlay.files_seen_by(workload, container)
        config_path = _config_path(container)
        document = yaml.safe_load(files[config_path])
        # Lay the pod's files out under tmp_path and load the config as the service would.
        root = tmp_path / workload["metadata"]["name"]
        for path, content in files.items():
            (root / path.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.relative_to("/")).write_bytes(content)
        for pool in document["pools"]:
            for tenant in pool["tenants"]:
                assert tenant.get("api_keys_file"), f"tenant {tenant['name']} has no key file"
                key_file = PurePosixPath(tenant["api_keys_file"])
                assert key_file in files, f"{container['name']}: {key_file} is not mounted"
                assert _secret_behind(workload, container, key_file) in secret_names
                tenant["api_keys_file"] = str(root / key_file.relative_to("/"))
        (root / "config.yaml").write_text(yaml.safe_dump(document))

        loaded = load_config(root / "config.yaml")

        keys = [
            key.get_secret_value()
            for pool in loaded.pools
            for tenant in pool.tenants
            for key in tenant.api_keys
        ]
        assert keys, "the key files hold no key"
        assert len(set(keys)) == len(keys), "two tenants share a key"


def _secret_behind(workload: Obj, container: Obj, path: PurePosixPath) -> str:
    """The Secret whose volume mount holds `path`."""
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    for mount in container["volumeMounts"]:
        if path.is_relative_to(mount["mountPath"]):
            volume = volumes[mount["name"]]
            assert "secret" in volume, f"{path} is mounted from {volume}, not from a Secret"
            name: str = volume["secret"]["secretName"]
            return name
    raise AssertionError(f"{path} is under no mount")


def test_only_the_control_plane_sees_the_admin_token(overlay: Manifests) -> None:
    (secret,) = overlay.of_kind("Secret")
    assert "admin-token" in secret["data"]

    for workload, container in overlay.slotshift_containers():
        names = {path.name for path in overlay.files_seen_by(workload, container)}
        assert ("admin-token" in names) == (container["args"][0] == "controlplane"), workload[
            "metadata"
        ]["name"]


@pytest.mark.parametrize("image", ["slotshift", "all-in-one"], ids=["slotshift", "jaeger"])
def test_containers_run_unprivileged_on_a_read_only_root(overlay: Manifests, image: str) -> None:
    pairs = [
        (w, c)
        for w in overlay.workloads()
        for c in pod_spec(w)["containers"]
        if image_name(c["image"]) == image
    ]
    assert pairs
    for workload, container in pairs:
        security = _effective_security(workload, container)
        assert security == {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, workload["metadata"]["name"]
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert len(tmp) == 1
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert "emptyDir" in volumes[tmp[0]["name"]]
        assert pod_spec(workload)["automountServiceAccountToken"] is False


def test_every_container_has_requests_and_limits(overlay: Manifests) -> None:
    for workload in overlay.workloads():
        for container in pod_spec(workload)["containers"]:
            resources = container["resources"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= resources[kind].keys(), (
                    f"{workload['metadata']['name']}/{container['name']}: {kind}"
                )


def test_service_links_are_off_so_no_variable_shadows_the_clis(overlay: Manifests) -> None:
    for workload, _ in overlay.slotshift_containers():
        assert pod_spec(workload)["enableServiceLinks"] is False


def _mount_of(container: Obj, path: PurePosixPath) -> Obj:
    mounts: list[Obj] = [
        m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])
    ]
    (mount,) = mounts
    return mount


def test_the_agent_reads_nvml_for_the_gpus_its_engine_names_without_taking_one(
    h200: Manifests,
) -> None:
    config = _config(h200)
    pod, container = h200.workload_running("agent")
    _, vllm = _vllm(h200)
    spec = pod_spec(pod)
    (watched,) = config.agent.watched_engines
    assert watched.gpus_file is not None
    gpus_file = PurePosixPath(watched.gpus_file)

    assert spec["runtimeClassName"] == "nvidia"
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["SLOTSHIFT_AGENT_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    for kind in ("requests", "limits"):
        assert not any(r.startswith("nvidia.com/") for r in container["resources"][kind])
    # The engine's container writes the file into a volume the agent reads.
    written, read = _mount_of(vllm, gpus_file), _mount_of(container, gpus_file)
    assert written["name"] == read["name"]
    assert read.get("readOnly") is True
    assert not written.get("readOnly", False)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[read["name"]]
    script = " ".join(vllm["command"])
    assert f"> {gpus_file}" in script
    assert "nvidia-smi --query-gpu=uuid --format=csv,noheader" in script
    assert 'exec vllm serve "$@"' in script


def test_without_gpus_the_agent_runs_beside_the_emulator_on_any_node(emulator: Manifests) -> None:
    agent, _ = emulator.workload_running("agent")
    engine_sim, _ = emulator.workload_running("engine-sim")

    assert agent == engine_sim
    assert "nodeSelector" not in pod_spec(agent)
    assert "runtimeClassName" not in pod_spec(agent)


def test_the_emulator_overlay_runs_the_engine_emulator(emulator: Manifests) -> None:
    config = _config(emulator)
    engine = urlsplit(config.pool(config.gateway.pool).engine_url)
    assert engine.hostname is not None
    assert engine.port is not None
    service, _ = emulator.service_at(engine.hostname, engine.port)

    (workload,) = emulator.workloads_selected_by(service)
    assert workload == emulator.workload_running("engine-sim")[0]
    assert engine.port == config.engine_sim.port


def _flag(args: list[str], flag: str) -> str:
    for index, arg in enumerate(args):
        if arg == flag:
            return args[index + 1]
        if arg.startswith(f"{flag}="):
            return arg.partition("=")[2]
    raise AssertionError(f"{flag} is not in {args}")


def _vllm(manifests: Manifests) -> tuple[Obj, Obj]:
    (pair,) = [
        (w, c)
        for w in manifests.workloads()
        for c in pod_spec(w)["containers"]
        if image_name(c["image"]) == "vllm-openai"
    ]
    return pair


def test_vllm_serves_the_study_model_on_one_gpu(h200: Manifests) -> None:
    config = _config(h200)
    workload, container = _vllm(h200)
    args = container["args"]

    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", container["image"])
    assert _flag(args, "--model") == "Qwen/Qwen2.5-3B-Instruct"
    assert int(_flag(args, "--max-num-seqs")) == 256 >= config.pool("default").budget_slots
    # The emulator that stands in for it elsewhere batches as much.
    assert config.engine_sim.max_num_seqs == 256
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    # Root, as the official image expects, but with nothing beyond what serving needs.
    assert _effective_security(workload, container) == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod_spec(workload)["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    engine = urlsplit(config.pool(config.gateway.pool).engine_url)
    assert engine.hostname is not None
    assert engine.port is not None
    service, _ = h200.service_at(engine.hostname, engine.port)
    assert h200.workloads_selected_by(service) == [workload]


def test_vllm_gets_time_to_load_and_a_model_cache(h200: Manifests) -> None:
    workload, container = _vllm(h200)
    port = int(_flag(container["args"], "--port"))

    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container[kind]
        assert probe["httpGet"]["path"] == "/health"
        assert container_port(container, probe["httpGet"]["port"]) == port
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    hf_home = env_of(container)["HF_HOME"]["value"]
    (cache_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == hf_home]
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    claim = volumes[cache_mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert h200.one("PersistentVolumeClaim", claim)
    assert workload["spec"]["strategy"] == {"type": "Recreate"}


def _collector_behind(manifests: Manifests, endpoint: str) -> Obj:
    """The workload an OTLP/gRPC endpoint URL reaches; it must listen for OTLP on 4317."""
    url = urlsplit(endpoint)
    assert url.scheme == "http"
    assert url.hostname is not None
    assert url.port is not None
    service, port = manifests.service_at(url.hostname, url.port)
    (collector,) = manifests.workloads_selected_by(service)
    (container,) = pod_spec(collector)["containers"]
    assert container_port(container, port["targetPort"]) == 4317
    assert env_of(container)["COLLECTOR_OTLP_ENABLED"]["value"] == "true"
    return collector


def test_the_slotshift_services_export_traces_to_the_collector(overlay: Manifests) -> None:
    names = set()
    for subcommand in SLOTSHIFT_SERVICES:
        _, container = overlay.workload_running(subcommand)
        env = env_of(container)
        _collector_behind(overlay, env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"])
        names.add(env["OTEL_SERVICE_NAME"]["value"])

    assert len(names) == len(SLOTSHIFT_SERVICES)


def test_vllm_exports_traces_to_the_same_collector(h200: Manifests) -> None:
    _, container = _vllm(h200)
    _, gateway = h200.workload_running("gateway")

    collector = _collector_behind(h200, _flag(container["args"], "--otlp-traces-endpoint"))

    assert collector == _collector_behind(
        h200, env_of(gateway)["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"]
    )


def test_the_jaeger_ui_has_a_service(overlay: Manifests) -> None:
    service = overlay.one("Service", "jaeger-query")
    (workload,) = overlay.workloads_selected_by(service)
    (container,) = pod_spec(workload)["containers"]

    assert [container_port(container, p["targetPort"]) for p in service["spec"]["ports"]] == [16686]
