"""Texts the telemetry agent tests scrape: captured-style vLLM V1 expositions and variants."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent

VLLM_SCRAPE_0 = (_HERE / "vllm_v1_scrape_0.txt").read_text()
"""Two-engine vLLM V1 server of Qwen/Qwen2.5-3B-Instruct (see the file's header)."""

VLLM_SCRAPE_1 = (_HERE / "vllm_v1_scrape_1.txt").read_text()
"""The same server 2 s later: 40 more first tokens on each engine."""

EMULATOR_GPU_GAUGES = """\
# HELP slotshift_sim_gpu_utilization_percent GPU utilisation the emulator models.
# TYPE slotshift_sim_gpu_utilization_percent gauge
slotshift_sim_gpu_utilization_percent{engine="0",model_name="Qwen/Qwen2.5-3B-Instruct"} 67.5
# HELP slotshift_sim_gpu_memory_used_bytes GPU memory the emulator models as used.
# TYPE slotshift_sim_gpu_memory_used_bytes gauge
slotshift_sim_gpu_memory_used_bytes{engine="0",model_name="Qwen/Qwen2.5-3B-Instruct"} 1.2e+11
# HELP slotshift_sim_gpu_memory_total_bytes GPU memory the emulator models.
# TYPE slotshift_sim_gpu_memory_total_bytes gauge
slotshift_sim_gpu_memory_total_bytes{engine="0",model_name="Qwen/Qwen2.5-3B-Instruct"} 1.5e+11
"""
"""The emulator's modelled-GPU gauges (engine_sim), to append to a vLLM exposition."""
