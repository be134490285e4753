"""The NetworkPolicies and the engine's key agree with the workloads they are about.

- every policy's podSelector, and every in-namespace peer's, selects pods some workload runs;
- under the default deny, the engine's port admits exactly the gateways' pods (nothing outside
  the namespace, no address block), and the hops of the topology are open (gateway to engine and
  control plane, agent to control plane) while others are not;
- every engine container requires a key (vLLM's VLLM_API_KEY or --api-key from a Secret, the
  emulator's engine_sim.api_key_file), the gateways send one of its keys to that pool's engine
  (pools[].engine_api_key_file), and no other slotshift container can read it.

Policies are evaluated as the NetworkPolicy API defines them, for pods of the namespace: a pod is
isolated in a direction when a policy of that type selects it, and then admits what some such
policy's rule allows (ports by number or by the container port's name; no `ports`: all ports;
no `from`/`to`: every peer).
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from slotshift.config import apply_overrides, parse_overrides
from slotshift_tools.cli import build_parser
from tests.deploy.manifests import (
    KUBERNETES_DIR,
    NAMESPACE,
    Manifests,
    Obj,
    env_of,
    expanded_args,
    image_name,
    pod_spec,
)
from tests.deploy.test_kubernetes_cross_checks import _config_seen_by

ENGINE_PORT = 8000
GRPC_PORT = 50051
POOL_LABEL = "slotshift.io/pool"


def _pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"].get("labels", {})
    return labels


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a set of labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _namespace_labels(manifests: Manifests) -> dict[str, str]:
    (namespace,) = [n for n in manifests.of_kind("Namespace") if n["metadata"]["name"] == NAMESPACE]
    return {**namespace["metadata"].get("labels", {}), "kubernetes.io/metadata.name": NAMESPACE}


def _peer_admits(manifests: Manifests, peer: Obj, source: Obj) -> bool:
    """Whether a `from`/`to` entry names the pods of `source`, a workload of the namespace."""
    if "ipBlock" in peer:
        # Pod addresses are in no manifest: an address block may hold any pod.
        return True
    if "namespaceSelector" in peer and not _selects(
        peer["namespaceSelector"], _namespace_labels(manifests)
    ):
        return False
    return _selects(peer.get("podSelector", {}), _pod_labels(source))


def _port_matches(rule: Obj, port: int, target_container_ports: dict[str, int]) -> bool:
    if "ports" not in rule:
        return True
    for entry in rule["ports"]:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        named = entry.get("port")
        if named is None:
            return True
        number = target_container_ports.get(named) if isinstance(named, str) else int(named)
        if number is not None and number <= port <= entry.get("endPort", number):
            return True
    return False


def _container_ports(workload: Obj) -> dict[str, int]:
    return {
        p["name"]: p["containerPort"]
        for c in pod_spec(workload)["containers"]
        for p in c.get("ports", [])
        if "name" in p
    }


def _allows(manifests: Manifests, direction: str, pod: Obj, peer: Obj, port: int) -> bool:
    """Whether `pod` (a workload) lets traffic with `peer` through in `direction` ("Ingress":
    from `peer` to `pod`'s `port`; "Egress": from `pod` to `peer`'s `port`)."""
    key = "ingress" if direction == "Ingress" else "egress"
    side = "from" if direction == "Ingress" else "to"
    ported = pod if direction == "Ingress" else peer
    policies = [
        p
        for p in manifests.of_kind("NetworkPolicy")
        if direction in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], _pod_labels(pod))
    ]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get(key, []):
            if not _port_matches(rule, port, _container_ports(ported)):
                continue
            if side not in rule or any(_peer_admits(manifests, e, peer) for e in rule[side]):
                return True
    return False


def reaches(manifests: Manifests, source: Obj, target: Obj, port: int) -> bool:
    """Whether pods of `source` may open a connection to `target`'s pods on `port`."""
    return _allows(manifests, "Egress", source, target, port) and _allows(
        manifests, "Ingress", target, source, port
    )


def _engine_workloads(manifests: Manifests) -> list[Obj]:
    engines = [
        w
        for w in manifests.workloads()
        if _pod_labels(w).get("app.kubernetes.io/component") == "engine"
    ]
    assert engines
    return engines


def _named(manifests: Manifests, name: str) -> Obj:
    return manifests.one("Deployment", name)


def _check_engine_ingress(manifests: Manifests) -> None:
    """The engine's port admits the gateways' pods and nothing else, from anywhere."""
    gateway = _named(manifests, "slotshift-gateway")
    for engine in _engine_workloads(manifests):
        name = engine["metadata"]["name"]
        admitted = [
            w["metadata"]["name"]
            for w in manifests.workloads()
            if _allows(manifests, "Ingress", engine, w, ENGINE_PORT)
        ]
        assert admitted == ["slotshift-gateway"], f"{name}:{ENGINE_PORT} admits {admitted}"
        assert reaches(manifests, gateway, engine, ENGINE_PORT)
        # No peer outside the namespace, no address block, no rule open to every peer.
        for policy in manifests.of_kind("NetworkPolicy"):
            if not _selects(policy["spec"]["podSelector"], _pod_labels(engine)):
                continue
            for rule in policy["spec"].get("ingress", []):
                if not _port_matches(rule, ENGINE_PORT, _container_ports(engine)):
                    continue
                assert "from" in rule, f"{policy['metadata']['name']} opens {name} to everyone"
                for peer in rule["from"]:
                    assert set(peer) == {"podSelector"}, (
                        f"{policy['metadata']['name']} admits {peer} to {name}:{ENGINE_PORT}"
                    )


def test_every_policy_selects_pods_that_the_workloads_run(overlay: Manifests) -> None:
    labels = [_pod_labels(w) for w in overlay.workloads()]
    policies = overlay.of_kind("NetworkPolicy")
    assert policies
    for policy in policies:
        name = policy["metadata"]["name"]
        selector = policy["spec"]["podSelector"]
        assert any(_selects(selector, pod) for pod in labels), f"{name} selects no pod"
        for rule in [*policy["spec"].get("ingress", []), *policy["spec"].get("egress", [])]:
            for peer in [*rule.get("from", []), *rule.get("to", [])]:
                if set(peer) == {"podSelector"}:
                    assert any(_selects(peer["podSelector"], pod) for pod in labels), (
                        f"{name}: the peer {peer} is no pod of the namespace"
                    )


def test_everything_is_denied_unless_a_policy_allows_it(overlay: Manifests) -> None:
    (deny,) = [
        p
        for p in overlay.of_kind("NetworkPolicy")
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny["metadata"]["name"] == "slotshift-default-deny"
    # DNS: every pod may ask the cluster's resolver.
    for workload in overlay.workloads():
        dns = [
            rule
            for p in overlay.of_kind("NetworkPolicy")
            if "Egress" in p["spec"]["policyTypes"]
            and _selects(p["spec"]["podSelector"], _pod_labels(workload))
            for rule in p["spec"].get("egress", [])
            if {"protocol": "UDP", "port": 53} in rule.get("ports", [])
        ]
        assert dns, f"{workload['metadata']['name']} cannot resolve names"


def test_the_engines_port_admits_exactly_the_gateways(overlay: Manifests) -> None:
    _check_engine_ingress(overlay)


def test_the_topologys_hops_are_open_and_no_others(overlay: Manifests) -> None:
    gateway = _named(overlay, "slotshift-gateway")
    controlplane = _named(overlay, "slotshift-controlplane")
    for engine in _engine_workloads(overlay):
        # The agent in the engine's pod streams to the control plane; the gateways too.
        assert reaches(overlay, engine, controlplane, GRPC_PORT)
        assert not reaches(overlay, controlplane, engine, ENGINE_PORT)
        assert not reaches(overlay, engine, gateway, 8080)
    assert reaches(overlay, gateway, controlplane, GRPC_PORT)
    # The control plane's gRPC port takes the gateways and the agents, and no other workload.
    callers = sorted(
        w["metadata"]["name"]
        for w in overlay.workloads()
        if _allows(overlay, "Ingress", controlplane, w, GRPC_PORT)
    )
    engines = [e["metadata"]["name"] for e in _engine_workloads(overlay)]
    assert callers == sorted(["slotshift-gateway", *engines])


@pytest.mark.parametrize(
    "breakage",
    ["open-to-everyone", "another-namespace", "wrong-label"],
)
def test_a_policy_that_lets_others_reach_the_engine_is_caught(
    renders: dict[Path, Manifests], breakage: str
) -> None:
    broken = copy.deepcopy(renders[KUBERNETES_DIR / "overlays" / "emulator"])
    policy = broken.one("NetworkPolicy", "slotshift-engine")
    rule = policy["spec"]["ingress"][0]
    if breakage == "open-to-everyone":
        del rule["from"]
    elif breakage == "another-namespace":
        rule["from"].append({"namespaceSelector": {}})
    else:
        rule["from"][0]["podSelector"]["matchLabels"] = {"app.kubernetes.io/part-of": "slotshift"}

    with pytest.raises(AssertionError, match="admits"):
        _check_engine_ingress(broken)


# --- the engine's key ---------------------------------------------------------------------


def _secret_value(manifests: Manifests, name: str, key: str) -> bytes:
    secret = manifests.one("Secret", name)
    return base64.b64decode(secret["data"][key])


def _engine_key_secrets(manifests: Manifests) -> list[Obj]:
    return [
        s
        for s in manifests.of_kind("Secret")
        if s["metadata"]["name"].startswith("slotshift-engine-keys")
    ]


def _tokens(content: bytes) -> list[str]:
    lines = (line.strip() for line in content.decode().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _engine_keys(manifests: Manifests, workload: Obj) -> tuple[Obj, list[str]]:
    """The engine container of `workload` and the keys it requires: vLLM's VLLM_API_KEY (from a
    Secret) or --api-key values, or the emulator's engine_sim.api_key_file, a mounted file."""
    for container in pod_spec(workload)["containers"]:
        if image_name(container["image"]) == "vllm-openai":
            args = [str(a) for a in container.get("args", [])]
            keys = [args[i + 1] for i, a in enumerate(args) if a == "--api-key"]
            entry = env_of(container).get("VLLM_API_KEY")
            if not keys and entry is not None:
                ref = entry["valueFrom"]["secretKeyRef"]
                keys = _tokens(_secret_value(manifests, ref["name"], ref["key"]))
            return container, keys
        if image_name(container["image"]) == "slotshift" and container["args"][0] == "engine-sim":
            parsed = build_parser().parse_args(expanded_args(workload, container))
            config = apply_overrides(
                _config_seen_by(manifests, workload, container), parse_overrides(parsed.overrides)
            )
            path = config.engine_sim.api_key_file
            if path is None:
                return container, []
            files = manifests.files_seen_by(workload, container)
            assert PurePosixPath(path) in files, f"{workload['metadata']['name']}: {path} unmounted"
            return container, _tokens(files[PurePosixPath(path)])
    raise AssertionError(f"{workload['metadata']['name']} runs no engine")


def _gateway_key(manifests: Manifests, pool: str) -> tuple[str, PurePosixPath]:
    """The key the gateways send to `pool`'s engine, and the file it is read from."""
    gateway, container = manifests.workload_running("gateway")
    config = _config_seen_by(manifests, gateway, container)
    path = config.pool(pool).engine_api_key_file
    assert path is not None, f"the gateways send no key to pool {pool}'s engine"
    files = manifests.files_seen_by(gateway, container)
    assert PurePosixPath(path) in files, f"the gateways' {path} is not mounted"
    tokens = _tokens(files[PurePosixPath(path)])
    assert tokens, f"the gateways' {path} holds no key"
    return tokens[0], PurePosixPath(path)


def _check_engine_keys(manifests: Manifests) -> None:
    for engine in _engine_workloads(manifests):
        pool = _pod_labels(engine)[POOL_LABEL]
        _, required = _engine_keys(manifests, engine)
        assert required, f"{engine['metadata']['name']} requires no API key"
        sent, _ = _gateway_key(manifests, pool)
        assert sent in required, f"the gateways' key for {pool} is not one its engine takes"


def test_every_engine_requires_a_key_that_the_gateways_of_its_pool_hold(
    overlay: Manifests,
) -> None:
    _check_engine_keys(overlay)


def test_no_other_slotshift_container_can_read_an_engine_key(overlay: Manifests) -> None:
    (keys,) = _engine_key_secrets(overlay)
    values = {_secret_value(overlay, keys["metadata"]["name"], k) for k in keys["data"]}
    for workload, container in overlay.slotshift_containers():
        if container["args"][0] in ("gateway", "engine-sim"):
            continue
        seen = set(overlay.files_seen_by(workload, container).values())
        assert not seen & values, f"{container['name']} of {workload['metadata']['name']}"
    # An emulator sees its own pool's key only.
    for engine in _engine_workloads(overlay):
        container, required = _engine_keys(overlay, engine)
        others = {v for v in values if _tokens(v) and _tokens(v)[0] not in required}
        assert not set(overlay.files_seen_by(engine, container).values()) & others


@pytest.mark.parametrize("overlay_name", ["emulator", "h200-vllm", "fleet-emulator"])
def test_an_engine_whose_key_differs_from_the_gateways_is_caught(
    renders: dict[Path, Manifests], overlay_name: str
) -> None:
    broken = copy.deepcopy(renders[KUBERNETES_DIR / "overlays" / overlay_name])
    (keys,) = _engine_key_secrets(broken)
    # The engines' keys change, the gateways' copy of the Secret keeps the old ones.
    gateway_copy: dict[str, Any] = copy.deepcopy(keys)
    gateway_copy["metadata"]["name"] += "-gateway"
    broken.objects.append(gateway_copy)
    gateway, _ = broken.workload_running("gateway")
    for volume in pod_spec(gateway)["volumes"]:
        if volume.get("secret", {}).get("secretName") == keys["metadata"]["name"]:
            volume["secret"]["secretName"] = gateway_copy["metadata"]["name"]
    keys["data"] = {k: base64.b64encode(b"rotated-on-one-side\n").decode() for k in keys["data"]}

    with pytest.raises(AssertionError, match="is not one its engine takes"):
        _check_engine_keys(broken)
