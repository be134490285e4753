"""slotshift's services as real processes, started as a user starts them: each on its own
(`slotshift <service> --config FILE`), so that tests can kill one with SIGKILL and start it
again, or all together (`slotshift up`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.stream_tokens import StreamTokens
from tests.support import TEST_TENANT_KEYS, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]


class ServiceProcesses:
    """Named service processes sharing one config file; every one is stopped at close(). The
    streams are authenticated with fresh tokens in `directory` (`stream_tokens`) unless the
    config sets its own controlplane.stream_auth, and tenants' keys are digested with the tests'
    secret unless it sets its own tenant_keys."""

    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        self.directory = directory
        self.config_path = directory / "slotshift.yaml"
        self.stream_tokens = StreamTokens.write(directory / "stream-tokens")
        config = {"tenant_keys": TEST_TENANT_KEYS, **config}
        self.config_path.write_text(yaml.safe_dump(self.stream_tokens.add_to(config)))
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, command: str, *args: str) -> None:
        log = (self.directory / f"{name}.log").open("ab")
        self._processes[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "slotshift_tools",
                command,
                "--config",
                str(self.config_path),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        log.close()

    def kill(self, name: str) -> None:
        """SIGKILL: the process gets no chance to clean up."""
        process = self._processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def signal(self, name: str, signum: signal.Signals) -> None:
        """Send `signum` to the running process `name` (SIGHUP: the control plane reloads)."""
        self._processes[name].send_signal(signum)

    def running(self, name: str) -> bool:
        process = self._processes.get(name)
        return process is not None and process.poll() is None

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for process in self._processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()


def run_in_checkout(*argv: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`python ARGV` from the checkout's root, as a user runs it; it must exit 0 within
    `timeout_s`."""
    result = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def log_tail(log: Path, lines: int = 60, *, skip: str | None = None) -> str:
    """The last lines of a process's log, leaving out those that contain `skip`."""
    text = log.read_text(errors="replace").splitlines()
    return "\n".join([line for line in text if skip is None or skip not in line][-lines:])


@contextmanager
def slotshift_up(
    log: Path,
    *,
    config: Path,
    settings: Mapping[str, object],
    ready: Callable[[], bool],
    ready_timeout_s: float,
    stop_timeout_s: float,
    extra_args: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
    skip_in_log: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`slotshift up` with `--set` for each setting, its output in `log`; yields once `ready()`
    holds, then stops it with SIGTERM and checks that it stopped cleanly."""
    command = [sys.executable, "-m", "slotshift_tools", "up", *extra_args, "--config", str(config)]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(environment or {})},
        )
    try:
        wait_until_sync(
            lambda: process.poll() is not None or ready(),
            timeout_s=ready_timeout_s,
            interval_s=0.2,
            message="slotshift up to become ready",
        )
        assert process.poll() is None, (
            f"slotshift up exited early:\n{log_tail(log, skip=skip_in_log)}"
        )
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, (
        f"slotshift up did not stop cleanly:\n{log_tail(log, skip=skip_in_log)}"
    )


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def grpc_serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_ready(check: Any, what: str, timeout_s: float = 30) -> None:
    wait_until_sync(check, timeout_s=timeout_s, message=what)


def scrape(url: str) -> dict[str, float]:
    """metric name (with labels folded in as name{k=v,...}) -> value."""
    with urllib.request.urlopen(url, timeout=2) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
