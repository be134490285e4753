"""The rendered manifests agree with what the services read and serve.

The config checked is the one in the ConfigMap, as the pods see it, with each container's `--set`
overrides applied as the CLI applies them (after the kubelet's `$(VAR)` expansion); ports, paths,
key files and commands are checked against that config, the CLI's parser and the services'
listeners. A fleet overlay runs one engine Deployment per pool, each with its own agent.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from slotshift.config import SlotshiftConfig, apply_overrides, parse_config, parse_overrides
from slotshift_tools.cli import build_parser, load
from tests.deploy import listeners
from tests.deploy.certificates import health_probe_args
from tests.deploy.manifests import (
    KUBERNETES_DIR,
    Manifests,
    Obj,
    container_port,
    env_of,
    expanded_args,
    image_name,
    pod_spec,
)

SLOTSHIFT_SERVICES = ("controlplane", "gateway", "agent")
RUN_AS_USER = 10001
REPO = Path(__file__).parents[2]
# The local fleet demo that the fleet overlay mirrors.
LOCAL_FLEET_CONFIG = REPO / "deploy" / "local" / "fleet.yaml"
POOL_LABEL = "slotshift.io/pool"


@pytest.fixture
def h200(renders: dict[Path, Manifests]) -> Manifests:
    return renders[KUBERNETES_DIR / "overlays" / "h200-vllm"]


@pytest.fixture
def emulator(renders: dict[Path, Manifests]) -> Manifests:
    return renders[KUBERNETES_DIR / "overlays" / "emulator"]


@pytest.fixture
def fleet(renders: dict[Path, Manifests]) -> Manifests:
    return renders[KUBERNETES_DIR / "overlays" / "fleet-emulator"]


def _config_path(container: Obj) -> PurePosixPath:
    args = build_parser().parse_args(container["args"])
    return PurePosixPath(args.config)


def _config_seen_by(manifests: Manifests, workload: Obj, container: Obj) -> SlotshiftConfig:
    files = manifests.files_seen_by(workload, container)
    path = _config_path(container)
    assert path in files, f"{container['name']}: --config {path} is not a mounted file"
    return parse_config(yaml.safe_load(files[path]), source=f"{container['name']}:{path}")


def _config(manifests: Manifests) -> SlotshiftConfig:
    """The config file every slotshift container reads: one, the same for all."""
    configs = [_config_seen_by(manifests, w, c) for w, c in manifests.slotshift_containers()]
    assert configs
    assert all(c == configs[0] for c in configs), "slotshift containers read different configs"
    return configs[0]


def _effective_config(manifests: Manifests, workload: Obj, container: Obj) -> SlotshiftConfig:
    """The config the container's service runs with: its config file with its `--set` overrides
    applied, as the CLI does, to the args the kubelet expands."""
    args = build_parser().parse_args(expanded_args(workload, container))
    config = _config_seen_by(manifests, workload, container)
    return apply_overrides(config, parse_overrides(args.overrides))


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
        commands.append((args.command, workload["metadata"]["name"]))

    # The control plane and the gateways once each; an agent in each engine pod, once; the
    # emulator only where it stands in for vLLM, beside an agent.
    pods_running = {
        command: [pod for c, pod in commands if c == command] for command, _ in commands
    }
    assert set(pods_running) - {"engine-sim"} == set(SLOTSHIFT_SERVICES)
    assert len(pods_running["controlplane"]) == len(pods_running["gateway"]) == 1
    agents = pods_running["agent"]
    assert len(set(agents)) == len(agents), "two agents in one pod"
    emulators = pods_running.get("engine-sim", [])
    assert len(set(emulators)) == len(emulators), "two emulators in one pod"
    assert set(emulators) <= set(agents), "an emulator without its agent"


def test_every_slotshift_container_reads_the_same_valid_config(overlay: Manifests) -> None:
    config = _config(overlay)
    fronted = [pool.name for pool in config.fronted_pools()]

    watched = []
    for workload, container in overlay.slotshift_containers():
        effective = _effective_config(overlay, workload, container)
        if container["args"][0] == "agent":
            (engine,) = effective.agent.watched_engines
            watched.append(engine.pool)
        else:
            assert effective.agent == config.agent, container["name"]
    # Every fronted pool's engine has one agent, which watches that engine alone.
    assert sorted(watched) == sorted(fronted)


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
            if "exec" in probe:
                # The gRPC health check over mutual TLS, from inside the pod.
                host, _, port_text = health_probe_args(probe).address.rpartition(":")
                assert host == "127.0.0.1", command
                assert int(port_text) in listeners.grpc_ports(command, config), command
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

    workload, _ = overlay.workload_running("controlplane")
    address = f"127.0.0.1:{config.controlplane.grpc_port}"
    # Exec probes (the kubelet's gRPC probe cannot do mutual TLS): tests/deploy/test_kubernetes_tls.py
    # checks their certificates.
    liveness = health_probe_args(controlplane["livenessProbe"])
    readiness = health_probe_args(controlplane["readinessProbe"])
    assert (liveness.address, liveness.service) == (address, "")
    # With several replicas only the leader is ready: it alone serves the gateways' stream.
    service = "" if workload["spec"]["replicas"] == 1 else "slotshift.v1.GatewayService"
    assert (readiness.address, readiness.service) == (address, service)
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

    configured = (config.gateway.controlplane_target, config.agent.controlplane_target)
    targets = [t for each in configured for t in ([each] if isinstance(each, str) else each)]
    for target in targets:
        host, _, port = target.rpartition(":")
        service, service_port = overlay.service_at(host, int(port))
        assert overlay.workloads_selected_by(service) == [controlplane]
        (opened,) = {
            container_port(c, service_port["targetPort"])
            for c in pod_spec(controlplane)["containers"]
        }
        assert opened == config.controlplane.grpc_port


def _engine_service(manifests: Manifests, engine_url: str) -> tuple[Obj, Obj]:
    """The Service a pool's engine_url names, and the port entry it names."""
    engine = urlsplit(engine_url)
    assert engine.hostname is not None
    assert engine.port is not None
    return manifests.service_at(engine.hostname, engine.port)


def _agents_by_pool(manifests: Manifests) -> dict[str, tuple[Obj, Obj, SlotshiftConfig]]:
    """For each fronted pool: the pod behind the Service its engine_url names, the agent
    container in that pod, and that agent's effective config. AssertionError when a Service
    selects no pod or several, or the pod has no agent or several."""
    found = {}
    for pool in _config(manifests).fronted_pools():
        service, _ = _engine_service(manifests, pool.engine_url)
        (engine_pod,) = manifests.workloads_selected_by(service)
        (agent,) = [
            c
            for c in pod_spec(engine_pod)["containers"]
            if image_name(c["image"]) == "slotshift" and c["args"][0] == "agent"
        ]
        found[pool.name] = (engine_pod, agent, _effective_config(manifests, engine_pod, agent))
    return found


def _check_each_agent_reports_the_pool_of_its_pods_service(manifests: Manifests) -> None:
    for pool, (_, _, effective) in _agents_by_pool(manifests).items():
        (watched,) = effective.agent.watched_engines
        assert watched.pool == pool, f"the agent beside {pool}'s engine reports {watched.pool}"


def test_the_agent_scrapes_the_engine_of_its_own_pod(overlay: Manifests) -> None:
    config = _config(overlay)

    for name, (engine_pod, _, effective) in _agents_by_pool(overlay).items():
        _, service_port = _engine_service(overlay, config.pool(name).engine_url)
        (watched,) = effective.agent.watched_engines
        metrics = urlsplit(watched.metrics_url)
        # A sidecar: each replica's agent watches the engine beside it, never one a Service
        # picks, and reports the pool whose engine_url names its pod's Service.
        assert watched.pool == name
        assert (metrics.hostname, metrics.path) == ("127.0.0.1", "/metrics")
        assert metrics.port == urlsplit(config.pool(name).engine_url).port
        (engine_container,) = [
            c
            for c in pod_spec(engine_pod)["containers"]
            if any(p.get("name") == service_port["targetPort"] for p in c.get("ports", []))
        ]
        assert container_port(engine_container, service_port["targetPort"]) == metrics.port
        assert "/metrics" in _engine_http_paths(engine_container, effective)[metrics.port]


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
    """One replica, replaced by Recreate; or several that share a PostgreSQL store (they elect
    one leader there) and that a rolling update may replace all at once (a follower is never
    ready: components/ha)."""
    controlplane, container = overlay.workload_running("controlplane")

    if controlplane["spec"]["replicas"] == 1:
        assert controlplane["spec"]["strategy"] == {"type": "Recreate"}
        return
    assert "controlplane.state_store.kind=postgresql" in container["args"]
    assert controlplane["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    (query,) = [
        s
        for s in overlay.of_kind("Service")
        if s["metadata"]["name"] == "slotshift-controlplane-query"
    ]
    assert query["spec"]["publishNotReadyAddresses"] is True


def test_every_tenant_key_file_is_a_mounted_secret_key(overlay: Manifests, tmp_path: Path) -> None:
    """Each container's config loads, with its key files and its `--set` overrides, as its
    service loads it (slotshift_tools.cli.load)."""
    secret_names = {s["metadata"]["name"] for s in overlay.of_kind("Secret")}
    for workload, container in overlay.slotshift_containers():
        files = overlay.files_seen_by(workload, container)
        config_path = _config_path(container)
        # Through JSON: YAML aliases (one tenant list for two pools) become copies, each
        # rewritten below once.
        document = json.loads(json.dumps(yaml.safe_load(files[config_path])))
        # Lay the pod's files out under tmp_path and load the config as the service would.
        root = tmp_path / workload["metadata"]["name"]
        for path, content in files.items():
            (root / path.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.relative_to("/")).write_bytes(content)
        # A replica group's members list no tenants: the group's hold the key files.
        for holder in [*document["pools"], *document.get("replica_groups", [])]:
            for tenant in holder.get("tenants", []):
                assert tenant.get("api_keys_file"), f"tenant {tenant['name']} has no key file"
                key_file = PurePosixPath(tenant["api_keys_file"])
                assert key_file in files, f"{container['name']}: {key_file} is not mounted"
                assert _secret_behind(workload, container, key_file) in secret_names
                tenant["api_keys_file"] = str(root / key_file.relative_to("/"))
        secret_file = PurePosixPath(document["tenant_keys"]["key_digest_secret_file"])
        assert secret_file in files, f"{container['name']}: {secret_file} is not mounted"
        assert _secret_behind(workload, container, secret_file) in secret_names
        document["tenant_keys"]["key_digest_secret_file"] = str(root / secret_file.relative_to("/"))
        (root / "config.yaml").write_text(yaml.safe_dump(document))
        args = build_parser().parse_args(expanded_args(workload, container))
        args.config = root / "config.yaml"

        loaded = load(args)

        # A tenant in several pools has its one key set in each.
        keys_of = {
            tenant.name: {key.get_secret_value() for key in tenant.api_keys}
            for pool in loaded.pools
            for tenant in pool.tenants
        }
        keys = [key for tenant_keys in keys_of.values() for key in tenant_keys]
        assert all(keys_of.values()), f"a key file holds no key: {keys_of}"
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


@pytest.mark.parametrize(
    ("key", "field"),
    [("admin-token", "admin_token_file"), ("query-token", "query_token_file")],
    ids=["admin-token", "query-token"],
)
def test_only_the_control_plane_sees_its_api_tokens_and_reads_them(
    overlay: Manifests, key: str, field: str
) -> None:
    """The admin token and the queries' token: the control plane's config names each as a file
    of the Secret slotshift-secrets it mounts; no other container can read either."""
    (secret,) = [s for s in overlay.of_kind("Secret") if key in s["data"]]
    assert secret["metadata"]["name"].startswith("slotshift-secrets")

    readers = []
    for workload, container in overlay.slotshift_containers():
        files = overlay.files_seen_by(workload, container)
        names = {path.name for path in files}
        is_control_plane = container["args"][0] == "controlplane"
        assert (key in names) == is_control_plane, workload["metadata"]["name"]
        if not is_control_plane:
            continue
        readers.append(workload["metadata"]["name"])
        named = getattr(_effective_config(overlay, workload, container).controlplane, field)
        assert named is not None, f"{field} is not set: the control plane would not ask for it"
        path = PurePosixPath(named)
        assert path in files, f"{container['name']}: {path} is not mounted"
        assert _secret_behind(workload, container, path) == secret["metadata"]["name"]
        assert files[path].decode().strip(), f"{path} holds no token"
    assert readers, "no control plane"


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
    names: dict[str, set[str]] = {}
    for subcommand in SLOTSHIFT_SERVICES:
        running = overlay.workloads_running(subcommand)
        assert running, subcommand
        for _, container in running:
            env = env_of(container)
            _collector_behind(overlay, env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"])
            names.setdefault(subcommand, set()).add(env["OTEL_SERVICE_NAME"]["value"])

    # One service name per service (every agent of a fleet is slotshift-agent), none shared.
    assert all(len(service_names) == 1 for service_names in names.values()), names
    assert len(set().union(*names.values())) == len(SLOTSHIFT_SERVICES)


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


def _fleet_engines(fleet: Manifests) -> dict[str, tuple[Obj, Obj, Obj]]:
    """For each pool: the Service its engine_url names, the one workload that Service selects,
    and the emulator container in it."""
    engines = {}
    for pool in _config(fleet).pools:
        service, _ = _engine_service(fleet, pool.engine_url)
        (workload,) = fleet.workloads_selected_by(service)
        (emulator,) = [
            c
            for c in pod_spec(workload)["containers"]
            if image_name(c["image"]) == "slotshift" and c["args"][0] == "engine-sim"
        ]
        engines[pool.name] = (service, workload, emulator)
    return engines


def test_the_fleet_gateways_front_every_pool_of_the_local_fleet_demo(fleet: Manifests) -> None:
    config = _config(fleet)
    local = parse_config(yaml.safe_load(LOCAL_FLEET_CONFIG.read_text()))
    gateway, container = fleet.workload_running("gateway")

    assert _effective_config(fleet, gateway, container).fronted_pools() == config.pools
    assert config.gateway.pools == [pool.name for pool in config.pools]
    # The same fleet as `slotshift up --config deploy/local/fleet.yaml`: only the engines'
    # addresses and keys and the way tenant keys are given differ.
    assert config.gateway.pools == local.gateway.pools
    for ours, theirs in zip(config.pools, local.pools, strict=True):
        different = {"engine_url", "engine_api_key_file", "tenants"}
        assert ours.model_dump(exclude=different) == theirs.model_dump(exclude=different)
        shape = {"api_keys", "api_keys_file"}
        assert [t.model_dump(exclude=shape) for t in ours.tenants] == [
            t.model_dump(exclude=shape) for t in theirs.tenants
        ]


def test_every_fleet_pool_has_an_engine_service_of_its_own_on_the_engines_port(
    fleet: Manifests,
) -> None:
    config = _config(fleet)
    engines = _fleet_engines(fleet)

    services = [service["metadata"]["name"] for service, _, _ in engines.values()]
    workloads = [workload["metadata"]["name"] for _, workload, _ in engines.values()]
    assert len(set(services)) == len(set(workloads)) == len(config.pools) == 3
    for name, (_, workload, emulator) in engines.items():
        _, service_port = _engine_service(fleet, config.pool(name).engine_url)
        effective = _effective_config(fleet, workload, emulator)
        assert container_port(emulator, service_port["targetPort"]) == effective.engine_sim.port
        assert service_port["port"] == effective.engine_sim.port
    # No engine Service or Deployment that no pool names.
    engine_objects = [
        o["metadata"]["name"]
        for o in fleet.of_kind("Service", "Deployment")
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
    ]
    assert sorted(engine_objects) == sorted(services + workloads)


def test_every_fleet_engine_service_selects_exactly_its_engines_pods(fleet: Manifests) -> None:
    for name, (service, workload, _) in _fleet_engines(fleet).items():
        selector = service["spec"]["selector"]
        labels = workload["spec"]["template"]["metadata"]["labels"]

        # The Service and the Deployment agree on the pods, by the pool's label.
        assert selector == workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        assert selector[POOL_LABEL] == labels[POOL_LABEL] == name
        assert fleet.workloads_selected_by(service) == [workload]
        assert workload["spec"]["replicas"] == 1, f"{name}: one engine per pool"


def test_each_fleet_engine_pods_agent_reports_the_pool_of_its_service(fleet: Manifests) -> None:
    _check_each_agent_reports_the_pool_of_its_pods_service(fleet)

    assert sorted(_agents_by_pool(fleet)) == sorted(p.name for p in _config(fleet).pools)


def test_an_agent_reporting_another_pool_is_caught(fleet: Manifests) -> None:
    broken = copy.deepcopy(fleet)
    _, small_b, _ = _fleet_engines(broken)["small-b"]
    (agent,) = [c for c in pod_spec(small_b)["containers"] if c["name"] == "agent"]
    pool_variable = env_of(agent)["SLOTSHIFT_POOL"]
    del pool_variable["valueFrom"]
    pool_variable["value"] = "small-a"

    with pytest.raises(AssertionError, match="small-b's engine reports small-a"):
        _check_each_agent_reports_the_pool_of_its_pods_service(broken)


def test_each_fleet_engine_serves_its_pools_model_on_the_demos_profile(fleet: Manifests) -> None:
    config = _config(fleet)
    local = parse_config(yaml.safe_load(LOCAL_FLEET_CONFIG.read_text()))

    for name, (_, workload, emulator) in _fleet_engines(fleet).items():
        effective = _effective_config(fleet, workload, emulator).engine_sim
        # As `slotshift up` starts the demo's emulators: the pool's first model, its profile.
        assert effective.model_name == config.pool(name).models[0]
        default_profile = type(effective).model_fields["profile"].default
        assert effective.profile == local.local_stack.emulator_profiles.get(name, default_profile)
    assert _fleet_engines(fleet)["large"][2]["args"][-1] == "engine_sim.profile=h200-qwen2.5-7b"


def _stream_token_files(config: SlotshiftConfig, subcommand: str) -> set[PurePosixPath]:
    """The stream-token files `subcommand` reads from `config`."""
    auth = config.controlplane.stream_auth
    named = {
        "controlplane": [auth.gateway_token_file, auth.agent_token_file],
        "gateway": [config.gateway.controlplane_token_file],
        "agent": [config.agent.controlplane_token_file],
    }.get(subcommand, [])
    return {PurePosixPath(path) for path in named if path is not None}


def test_each_role_presents_a_stream_token_the_control_plane_takes_and_sees_no_other(
    overlay: Manifests,
) -> None:
    cp_workload, cp_container = overlay.workload_running("controlplane")
    cp_files = overlay.files_seen_by(cp_workload, cp_container)
    auth = _effective_config(overlay, cp_workload, cp_container).controlplane.stream_auth
    assert auth.gateway_token_file is not None and auth.agent_token_file is not None
    assert not auth.insecure_allow_unauthenticated
    accepted = {
        role: set(cp_files[PurePosixPath(path)].decode().split())
        for role, path in (("gateway", auth.gateway_token_file), ("agent", auth.agent_token_file))
    }
    assert not accepted["gateway"] & accepted["agent"], "the two roles share a token"
    token_files = {path for path in cp_files if path.is_relative_to("/etc/slotshift/stream-tokens")}
    for workload, container in overlay.slotshift_containers():
        subcommand = container["args"][0]
        config = _effective_config(overlay, workload, container)
        files = overlay.files_seen_by(workload, container)
        reads = _stream_token_files(config, subcommand)
        seen = {path for path in files if path in token_files}
        name = workload["metadata"]["name"]
        # A gateway cannot pass for an agent (nor an agent for a gateway): it holds its own only.
        assert seen == reads, f"{name} ({subcommand}) sees {seen}, reads {reads}"
        if subcommand in ("gateway", "agent"):
            (path,) = reads
            assert files[path].decode().split()[0] in accepted[subcommand], name
