"""Generate the Python code for the API in proto/ into slotshift/v1/.

The one way generated code enters the tree: `_pb2.py`, `_pb2_grpc.py` and their mypy stubs
(`.pyi`, by mypy-protobuf). The output is committed; tests/test_generated_code.py regenerates
into a temporary folder and fails on any difference.

    python scripts/gen_protos.py            # regenerate in place
    python scripts/gen_protos.py --out DIR  # generate under DIR (DIR/slotshift/v1/...)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("slotshift") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
INIT_TEXT = '"""Generated from proto/slotshift/v1 by scripts/gen_protos.py; do not edit."""\n'


def generate(out_root: Path) -> list[Path]:
    """Generate every proto under proto/slotshift/v1 into out_root/slotshift/v1; return the files."""
    protos = sorted(
        str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto")
    )
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    # protoc finds the mypy-protobuf plugins on PATH; they sit beside this interpreter.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        well_known = Path(protoc.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        target = out_root / PACKAGE_DIR
        target.mkdir(parents=True, exist_ok=True)
        for old in target.iterdir():
            if old.name.endswith(GENERATED_SUFFIXES):
                old.unlink()
        written = []
        for produced in sorted((Path(tmp) / PACKAGE_DIR).iterdir()):
            if produced.name.endswith(GENERATED_SUFFIXES):
                shutil.copyfile(produced, target / produced.name)
                written.append(target / produced.name)
        init = target / "__init__.py"
        init.write_text(INIT_TEXT)
        written.append(init)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to generate under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
