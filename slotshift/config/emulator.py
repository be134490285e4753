"""The vLLM emulator's section (engine_sim/)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slotshift.config.base import ConfigModel, Port, PositiveSeconds

EmulatorProfile = Literal["h200-qwen2.5-3b", "h200-qwen2.5-7b"]
"""The emulated GPUs and models (engine_sim/profiles.py)."""


class EngineSimConfig(ConfigModel):
    """The vLLM emulator: an OpenAI-compatible server that models continuous batching."""

    host: str = "127.0.0.1"
    """Address the emulator binds."""

    port: Port = 8000
    """Port of its OpenAI API and /metrics; 0 picks one."""

    api_key_file: str | None = None
    """A file of API keys, one per line (blank lines and `#` comments skipped), such as a
    mounted Kubernetes Secret: as vLLM with --api-key, requests to the API routes (`/v1/...`)
    need `Authorization: Bearer KEY` with one of them, else 401 `{"error": "Unauthorized"}`;
    /health, /metrics, /version, /tokenize and /sim/... stay open, as vLLM leaves every path
    outside /v1 open. A relative path is relative to the config file's folder. Unset: no key is
    required."""

    profile: EmulatorProfile = "h200-qwen2.5-3b"
    """The emulated GPU and model (see engine_sim/profiles.py): step-time costs, batch limits,
    KV-cache size and memory. Every field below that is unset (null) takes the profile's value;
    a value set here overrides the profile's. The emulator refuses to start, as vLLM would, when
    one full-length request does not fit the KV cache or weights and cache exceed GPU memory."""

    model_name: str | None = None
    """The model name it serves and labels its metrics with; unset: the profile's model."""

    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    """Most sequences in one batch (vLLM's --max-num-seqs); unset: the profile's."""

    max_num_batched_tokens: Annotated[int, Field(ge=1)] | None = None
    """Most tokens one step processes, prefill and decode together; unset: the profile's."""

    kv_cache_blocks: Annotated[int, Field(ge=1)] | None = None
    """KV-cache capacity in blocks (requests wait when it is full); unset: the profile's."""

    block_size_tokens: Annotated[int, Field(ge=1)] = 16
    """Tokens per KV-cache block."""

    max_model_len: Annotated[int, Field(ge=16)] = 32768
    """Longest prompt plus output, in tokens."""

    step_base_ms: Annotated[float, Field(ge=0)] | None = None
    """Fixed cost of one engine step; unset: the profile's."""

    step_per_seq_ms: Annotated[float, Field(ge=0)] | None = None
    """Added step time per sequence in the batch; unset: the profile's."""

    step_per_context_token_us: Annotated[float, Field(ge=0)] | None = None
    """Added step time per context token held by the batch, in microseconds; unset: the
    profile's."""

    step_per_prefill_token_us: Annotated[float, Field(ge=0)] | None = None
    """Added step time per prompt token prefilled in the step, in microseconds; unset: the
    profile's."""

    default_max_tokens: Annotated[int, Field(ge=1)] = 256
    """Output tokens a request gets when its max_tokens is unbounded (capped by max_model_len):
    a chat that names none, or a completion whose max_tokens is null (vLLM's own default
    for a completion without the key, 16, applies as in vLLM)."""

    pseudo_eos_max_tokens: Annotated[int, Field(ge=1)] = 1024
    """Without ignore_eos a request stops at a pseudo end-of-sequence that each sampled token is
    with probability 2 / (this + 1), a function of the context (engine_sim/tokens.py): output
    lengths are geometric with mean (this + 1) / 2, the mean of a uniform 1..this law (unless
    max_tokens comes first; min_tokens delays it)."""

    enable_prefix_caching: bool = True
    """Cache full KV blocks by their tokens' chained hash and let later requests that start with
    the same tokens skip computing them (vLLM's --enable-prefix-caching, on by default in V1)."""

    enable_prompt_tokens_details: bool = False
    """Report usage.prompt_tokens_details.cached_tokens, the prompt tokens found in the prefix
    cache (vLLM's --enable-prompt-tokens-details, off by default)."""

    gpu_memory_total_bytes: Annotated[int, Field(ge=1)] | None = None
    """Memory of the emulated GPU as NVML reports it; unset: the profile's (an H200)."""

    model_weights_bytes: Annotated[int, Field(ge=0)] | None = None
    """Memory the emulated model's weights hold; unset: the profile's (bf16 weights)."""

    kv_cache_bytes_per_token: Annotated[int, Field(ge=1)] | None = None
    """KV-cache memory one token holds (layers x KV heads x head dims x K,V x 2 bytes); with
    kv_cache_blocks it sets the emulated memory in use; unset: the profile's."""

    gpu_utilization_window_s: PositiveSeconds = 1.0
    """Seconds over which the emulated GPU utilisation (busy time / wall time) is averaged."""

    shutdown_grace_s: PositiveSeconds = 5.0
    """Seconds running requests get to finish when the emulator stops; the rest are aborted."""
