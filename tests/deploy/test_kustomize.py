"""Every kustomization renders, and every object it renders is valid against the Kubernetes API.

The schemas come from the PyPI package kubernetes-validate, which ships them (no network); strict
schemas reject fields the API does not know, so a misspelt field fails here, not at apply time.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.deploy.conftest import kustomization_id
from tests.deploy.manifests import NAMESPACE, Manifests, kustomizations, render

# The oldest API the manifests must still work with (gRPC probes, policy/v1, PSA labels are all
# older); the newest is whatever kubernetes-validate ships.
OLDEST_KUBERNETES = "1.30"
CLUSTER_SCOPED_KINDS = {"Namespace", "RuntimeClass", "ClusterRole", "ClusterRoleBinding"}


@pytest.fixture(scope="module")
def kubernetes_validate() -> ModuleType:
    module: ModuleType = pytest.importorskip(
        "kubernetes_validate",
        reason="the dev dependency kubernetes-validate (API schemas, offline) is not installed",
    )
    return module


def test_the_deploy_tree_has_the_base_and_the_overlays() -> None:
    found = {kustomization_id(p) for p in kustomizations()}

    assert {"base", "overlays/h200-vllm", "overlays/emulator", "overlays/fleet-emulator"} <= found


@pytest.mark.parametrize("kustomization", kustomizations(), ids=kustomization_id)
def test_every_kustomization_renders(kubectl: Path, kustomization: Path) -> None:
    manifests = render(kubectl, kustomization)

    kinds = {o["kind"] for o in manifests.objects}
    assert {"Namespace", "ConfigMap", "Secret", "Deployment", "Service"} <= kinds


@pytest.mark.parametrize("kustomization", kustomizations(), ids=kustomization_id)
def test_every_rendered_object_validates_against_the_api_schemas(
    kubernetes_validate: ModuleType, renders: dict[Path, Manifests], kustomization: Path
) -> None:
    versions = (OLDEST_KUBERNETES, kubernetes_validate.latest_version())
    problems = []
    for obj in renders[kustomization].objects:
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(part) for part in exc.path)
                problems.append(
                    f"{obj['kind']}/{obj['metadata']['name']} ({version}) {path}: {exc}"
                )

    assert not problems, "\n".join(problems)


def test_the_schema_check_rejects_a_misspelt_field(
    kubernetes_validate: ModuleType, overlay: Manifests
) -> None:
    deployment: dict[str, Any] = copy.deepcopy(overlay.of_kind("Deployment")[0])
    deployment["spec"]["replicaz"] = 2

    with pytest.raises(kubernetes_validate.ValidationError, match="replicaz"):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_every_namespaced_object_lands_in_the_slotshift_namespace(overlay: Manifests) -> None:
    stray = [
        f"{o['kind']}/{o['metadata']['name']}: {o['metadata'].get('namespace')}"
        for o in overlay.objects
        if o["kind"] not in CLUSTER_SCOPED_KINDS and o["metadata"].get("namespace") != NAMESPACE
    ]

    assert not stray
    assert overlay.one("Namespace", NAMESPACE)
