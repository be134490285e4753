"""The import-linter contracts in pyproject.toml hold the floors: the real tree keeps them, and a
copy of it with one forbidden import added breaks the contract that names that rule.

Each case runs `lint-imports` itself on a copy of the six root packages (sources only) with the
project's own configuration, so what is checked is the command CI runs, not a model of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT_PACKAGES = (
    "slotshift",
    "slotshift_tools",
    "controlplane",
    "admission_gateway",
    "telemetry_agent",
    "engine_sim",
)
FLOORS = "Floors: tools above the services, the services independent, the ground below"
CORES_ONLY = "Tools use only the services' pure cores; only the CLI imports the mains"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on the packages under `tree` with the configuration there; no cache."""
    # The copy comes first on the path, ahead of the editable install of the real tree.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the root packages' sources and pyproject.toml, for each case to copy again."""
    tree = tmp_path_factory.mktemp("tree")
    for package in ROOT_PACKAGES:
        shutil.copytree(
            REPO / package,
            tree / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_the_real_tree_keeps_every_contract() -> None:
    result = _lint_imports(REPO)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "source", "contract", "expected"),
    [
        pytest.param(
            "controlplane/_tool_user.py",
            "import slotshift_tools.bench.stats\n",
            FLOORS,
            "controlplane._tool_user -> slotshift_tools.bench.stats",
            id="a-service-imports-a-tool",
        ),
        pytest.param(
            "slotshift/_service_user.py",
            "import controlplane.core\n",
            FLOORS,
            "slotshift._service_user -> controlplane.core",
            id="the-ground-imports-a-service",
        ),
        pytest.param(
            "telemetry_agent/_neighbour.py",
            "import admission_gateway.gateway_state\n",
            FLOORS,
            "telemetry_agent._neighbour -> admission_gateway.gateway_state",
            id="a-service-imports-another",
        ),
        pytest.param(
            "slotshift_tools/_in_process.py",
            "import controlplane.server\n",
            CORES_ONLY,
            "slotshift_tools._in_process -> controlplane.server",
            id="a-tool-imports-a-server",
        ),
        pytest.param(
            "slotshift_tools/_starter.py",
            "import engine_sim.main\n",
            CORES_ONLY,
            "slotshift_tools._starter -> engine_sim.main",
            id="a-tool-other-than-the-cli-imports-a-main",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tree_copy: Path,
    tmp_path: Path,
    module: str,
    source: str,
    contract: str,
    expected: str,
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(tree_copy, tree)
    (tree / module).write_text(source)

    result = _lint_imports(tree)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract} BROKEN" in result.stdout
    assert expected in result.stdout
    assert "1 broken" in result.stdout


def test_a_tool_may_use_the_services_pure_cores(tree_copy: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(tree_copy, tree)
    (tree / "slotshift_tools" / "_twin.py").write_text(
        "import admission_gateway.admission\n"
        "import controlplane.core.slo_policy\n"
        "import engine_sim.engine_core\n"
    )

    result = _lint_imports(tree)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
