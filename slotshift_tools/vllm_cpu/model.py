"""The tiny model the CPU vLLM serves, made offline (see tiny_model.py) and cached.

The tokenizer is trained on the checkout's own prose and API (README, docs, protos): local text
that is always there. A stamp beside the model holds the hash of what it was made from (the
builder, the corpus, the venv's lock); the model is made again only when that changes, in a few
seconds. The model's shape does not depend on the corpus (the vocabulary is a fixed size), so
vLLM's compiled graphs for it stay valid when the docs change.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from slotshift_tools.vllm_cpu.environment import (
    VllmCpuPaths,
    VllmCpuSetupError,
    exclusive,
    lock_digest,
    run_checked,
)

logger = logging.getLogger(__name__)

CORPUS_PATTERNS = ("README.md", "docs/**/*.md", "proto/**/*.proto")
"""Files of the checkout the tokenizer is trained on, relative to its root."""

_BUILDER = Path(__file__).with_name("tiny_model.py")
_STAMP_NAME = ".slotshift-model-sha256"


def corpus_files(paths: VllmCpuPaths) -> list[Path]:
    """The corpus, in a fixed order."""
    found = {path for pattern in CORPUS_PATTERNS for path in paths.root.glob(pattern)}
    return sorted(path for path in found if path.is_file())


def model_digest(paths: VllmCpuPaths) -> str:
    """What the stamp of a model made from the present builder, corpus and lock holds."""
    digest = hashlib.sha256(_BUILDER.read_bytes())
    digest.update(lock_digest(paths).encode())
    for path in corpus_files(paths):
        digest.update(str(path.relative_to(paths.root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def model_is_current(paths: VllmCpuPaths) -> bool:
    """True when the model exists and was made from the present builder, corpus and lock."""
    stamp = paths.model / _STAMP_NAME
    return stamp.is_file() and stamp.read_text().strip() == model_digest(paths)


def ensure_model(paths: VllmCpuPaths, python: Path) -> Path:
    """Make the tiny model with the vLLM venv's `python` unless it is current; return its folder."""
    with exclusive(paths, "vllm-cpu-model"):
        if model_is_current(paths):
            return paths.model
        corpus = corpus_files(paths)
        if not corpus:
            raise VllmCpuSetupError(f"no corpus for the tokenizer under {paths.root}")
        logger.info("making the tiny model in %s from %d local files", paths.model, len(corpus))
        partial = paths.model.with_name(paths.model.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        output = run_checked(
            [str(python), str(_BUILDER), str(partial), *(str(path) for path in corpus)],
            "make the tiny model",
        )
        logger.info("%s", output.strip())
        (partial / _STAMP_NAME).write_text(model_digest(paths) + "\n")
        shutil.rmtree(paths.model, ignore_errors=True)
        partial.rename(paths.model)
        return paths.model
