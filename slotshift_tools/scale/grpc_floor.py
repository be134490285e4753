"""The floor under the control plane's per-message cost: CPU per message of a bare grpc.aio
bidirectional stream in Python, on this machine.

    python -m slotshift_tools.scale.grpc_floor [--streams 10] [--rate-per-s 24] [--duration-s 20]

A server process echoes every message of `streams` streams; a client process sends `rate_per_s`
messages a second on each (60 bytes, about a small delta report) for `duration_s`. It prints the
server's CPU over that time and per message (one read and one write each): what any Python
gRPC service spends before doing anything with a message (docs/results/scale.md).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import grpc

from slotshift_tools.local_stack import HOST, StackPorts

_METHOD = "/floor.Echo/Echo"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _serve(port: int) -> None:
    async def echo(
        messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> None:
        async for message in messages:
            await context.write(message)

    handler = grpc.method_handlers_generic_handler(
        "floor.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"{HOST}:{port}")
    await server.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    started_cpu_s, started_s = _cpu_s(), time.monotonic()
    await loop.run_in_executor(None, sys.stdin.readline)
    print(f"{_cpu_s() - started_cpu_s:.6f} {time.monotonic() - started_s:.3f}", flush=True)
    await server.stop(0)


async def _send(port: int, streams: int, rate_per_s: float, duration_s: float) -> int:
    async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
        # Bytes both ways: no protobuf, the bare stream.
        method = channel.stream_stream(_METHOD, None, None)

        async def one() -> int:
            call = method(None)

            async def drain() -> None:
                async for _ in call:
                    pass

            reader = asyncio.create_task(drain(), name="floor-reader")
            sent = 0
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                await call.write(b"x" * 60)
                sent += 1
                await asyncio.sleep(1.0 / rate_per_s)
            await call.done_writing()
            await reader
            return sent

        return sum(await asyncio.gather(*(one() for _ in range(streams))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--rate-per-s", type=float, default=24.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        asyncio.run(_serve(args.serve))
        return 0
    port = StackPorts.free(0).controlplane
    server = subprocess.Popen(
        [sys.executable, "-m", "slotshift_tools.scale.grpc_floor", "--serve", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the echo server did not start")
        server.stdin.write("go\n")
        server.stdin.flush()
        sent = asyncio.run(_send(port, args.streams, args.rate_per_s, args.duration_s))
        server.stdin.write("stop\n")
        server.stdin.flush()
        cpu_s, wall_s = (float(v) for v in server.stdout.readline().split())
    finally:
        server.wait(timeout=10)
    messages = 2 * sent
    print(
        f"{messages} messages ({messages / wall_s:.0f}/s) on {args.streams} streams: server "
        f"{cpu_s / wall_s:.4f} of a core, {1e6 * cpu_s / messages:.1f} µs of CPU a message"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
