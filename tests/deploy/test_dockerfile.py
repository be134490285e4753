"""The Dockerfile: multi-stage, installs the locked dependencies and every package, runs as the uid
the manifests expect, with `slotshift` as its entrypoint."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
# The manifests and the compose file mount the config here and run as this user.
CONFIG_PATH = "/etc/slotshift/config/slotshift.yaml"
RUN_AS = "10001:10001"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def _instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions, continuation lines joined and comments dropped."""
    instructions = []
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, arguments = logical.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
        logical = ""
    return instructions


def _stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


@pytest.fixture(scope="module")
def stages() -> list[list[Instruction]]:
    return _stages(_instructions((REPO / "Dockerfile").read_text()))


def _pyproject() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def _packages() -> set[str]:
    """Top-level packages that pyproject's package discovery includes."""
    setuptools = _pyproject()["tool"]["setuptools"]  # type: ignore[index]
    patterns: list[str] = setuptools["packages"]["find"]["include"]
    return {
        path.parent.name
        for path in REPO.glob("*/__init__.py")
        if any(fnmatch.fnmatch(path.parent.name, p) for p in patterns)
    }


def test_the_build_has_two_stages_from_python_3_11_slim(stages: list[list[Instruction]]) -> None:
    build_args = dict(
        i.arguments.split("=", 1)
        for i in _instructions((REPO / "Dockerfile").read_text())
        if i.keyword == "ARG"
    )

    assert len(stages) == 2
    assert stages[0][0].arguments.endswith(" AS builder")
    assert build_args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert all(stage[0].arguments.split()[0] == "${PYTHON_IMAGE}" for stage in stages)


def test_the_builder_installs_the_lock_and_every_package(stages: list[list[Instruction]]) -> None:
    builder = stages[0]
    copied = {i.arguments.split()[0] for i in builder if i.keyword == "COPY"}
    installs = [i.arguments for i in builder if i.keyword == "RUN" and "pip install" in i.arguments]

    assert _packages() <= copied
    assert {"pyproject.toml", "requirements/constraints.txt"} <= copied
    assert installs
    assert all("-c requirements/constraints.txt" in command for command in installs)


def test_the_build_context_lets_in_what_the_builder_copies(
    stages: list[list[Instruction]],
) -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {
        source.rstrip("/")
        for i in stages[0]
        if i.keyword == "COPY" and not i.arguments.startswith("--from")
        for source in i.arguments.split()[:-1]
    }

    assert lines[0] == "*" or "*" in lines
    assert copied <= allowed


def test_the_runtime_runs_slotshift_as_the_manifests_user(stages: list[list[Instruction]]) -> None:
    runtime = stages[-1]
    by_keyword = {i.keyword: i.arguments for i in runtime}

    assert by_keyword["USER"] == RUN_AS
    assert json.loads(by_keyword["ENTRYPOINT"]) == ["slotshift"]
    assert "slotshift" in _pyproject()["project"]["scripts"]  # type: ignore[index]
    assert "COPY --from=builder" in f"COPY {by_keyword['COPY']}"
    assert f"SLOTSHIFT_CONFIG={CONFIG_PATH}" in by_keyword["ENV"]
    assert json.loads(by_keyword["CMD"]) == ["--help"]
