"""What `slotshift up` starts on one machine."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slotshift.config.base import ConfigModel, Port, PositiveSeconds
from slotshift.config.emulator import EmulatorProfile


class LocalStackConfig(ConfigModel):
    """What `slotshift up` starts on one machine."""

    gateway_ports: list[Port] = Field(default_factory=lambda: [8080, 8081])
    """One gateway process per port."""

    start_engine_sim: bool = True
    """Start the emulator (false when a real engine serves the pool's engine_url)."""

    emulator_profiles: dict[str, EmulatorProfile] = Field(default_factory=dict)
    """pool -> the profile of the emulator started for it (with several fronted pools, one
    emulator runs per pool); a pool not named here gets `engine_sim.profile`."""

    restart_services: bool = True
    """Restart a service that exits on its own, with backoff (0.5 s doubling to 10 s), while the
    others keep serving; `slotshift up` stops only when asked or when a service exits more than
    5 times in 60 s. False: any service exiting stops the stack."""

    ready_timeout_s: PositiveSeconds = 30.0
    """Seconds each service gets to become ready."""

    engine: Literal["emulator", "vllm"] = "emulator"
    """The engine `slotshift up` starts: the emulator (if start_engine_sim), or real vLLM on the
    CPU with a tiny local model (slotshift_tools/vllm_cpu; needs a checkout, builds its venv the first
    time), which the gateways' pool and the agent are then pointed at."""

    vllm_port: Port | None = None
    """Port of the CPU vLLM server; unset: the port of the pool's engine_url (where the emulator
    would listen, so whatever is pointed at the engine finds vLLM there); 0 picks a free one."""

    vllm_served_model_name: str = "slotshift/tiny-llama"
    """The model name the CPU vLLM serves (clients put it in `model`)."""

    vllm_served_model_aliases: list[str] = Field(default_factory=list)
    """More names the CPU vLLM answers to (its --served-model-name takes several; it answers
    with the first, whatever name was asked): aliases of one engine, so one pool and one
    budget (list them in the pool's `models` after the first)."""

    vllm_max_num_seqs: Annotated[int, Field(ge=1)] = 64
    """vLLM's --max-num-seqs: requests in one batch; beyond it requests wait inside vLLM."""

    vllm_block_size_tokens: Annotated[int, Field(ge=32, multiple_of=32)] | None = 32
    """vLLM's --block-size: KV-cache block tokens (its CPU build takes multiples of 32). Small
    blocks let a paused request's continuation hit the prefix cache (it hits whole blocks
    only); unset: vLLM's own choice (128 on the CPU)."""

    vllm_ready_timeout_s: PositiveSeconds = 120.0
    """Seconds the CPU vLLM gets to answer /health (35-100 s here: the first start of a model
    compiles it)."""

    vllm_otlp_traces_endpoint: str | None = None
    """vLLM's --otlp-traces-endpoint (OTLP/gRPC, e.g. http://127.0.0.1:4317); unset: no traces."""
