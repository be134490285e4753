# Sourced by the other scripts: make .venv with the locked dependencies and slotshift installed.
# Idempotent: a venv whose lock stamp matches is reused.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SLOTSHIFT_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.slotshift-lock"
want="$(cat "$ROOT/requirements/constraints.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing slotshift and its locked dependencies into $VENV" >&2
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "bootstrap: Python 3.11 or newer is needed ($PYTHON is older)" >&2; exit 1; }
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$ROOT/requirements/constraints.txt" -e "$ROOT[dev]"
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
