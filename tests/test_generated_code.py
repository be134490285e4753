"""The committed generated code is exactly what scripts/gen_protos.py makes from proto/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    generated = _generator().generate(tmp_path)  # type: ignore[attr-defined]
    assert generated, "the generator produced nothing"
    committed_dir = ROOT / "slotshift" / "v1"
    fresh = {p.name: p.read_text() for p in generated}
    committed = {
        p.name: p.read_text()
        for p in committed_dir.iterdir()
        if p.is_file() and (p.name.endswith((".py", ".pyi")))
    }
    assert sorted(committed) == sorted(fresh), "files differ: run python scripts/gen_protos.py"
    stale = [name for name, text in fresh.items() if committed[name] != text]
    assert not stale, f"stale generated files {stale}: run python scripts/gen_protos.py"
