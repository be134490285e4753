#!/usr/bin/env bash
# Quick start, step two: every check CI runs. Extra arguments go to pytest.
source "$(dirname "$0")/bootstrap.sh"
echo "== generated code is up to date, lint, types, layers" >&2
ruff check .
ruff format --check .
mypy
lint-imports
echo "== tests" >&2
exec pytest "$@"
