"""What the real-vLLM tier's tests read from the running stack: vLLM's own /metrics (the witness
of what is inside the engine), the gateways' /metrics, and the control plane through grpcurl."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from telemetry_agent.vllm_metrics import VllmSnapshot, parse_vllm_metrics
from tests.grpcurl import grpcurl, limits
from tests.support import wait_until_sync
from tests.vllm.conftest import BUDGET_SLOTS, VllmStack

NOMINAL_SLOTS = BUDGET_SLOTS // 2


def http_get(url: str) -> str:
    """The body of a GET, as text."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def vllm_snapshot(stack: VllmStack) -> VllmSnapshot:
    """vLLM's own view, through the agent's parser."""
    return parse_vllm_metrics(http_get(f"{stack.vllm_url}/metrics"))


def _counter_sum(text: str, family: str, labels: dict[str, str]) -> float:
    total = 0.0
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            total += sum(
                s.value
                for s in metric.samples
                if s.name == f"{family}_total" and labels.items() <= s.labels.items()
            )
    return total


def vllm_counter(stack: VllmStack, family: str, **labels: str) -> float:
    """The sum of a vLLM counter's series that carry `labels` (`family` without `_total`)."""
    return _counter_sum(http_get(f"{stack.vllm_url}/metrics"), family, labels)


def gateways_counter(stack: VllmStack, family: str, **labels: str) -> float:
    """The sum over both gateways of a counter's series that carry `labels`."""
    return sum(
        _counter_sum(http_get(f"{url}/metrics"), family, labels) for url in stack.gateway_urls
    )


def gateways_gauge(stack: VllmStack, family: str, **labels: str) -> float:
    """The sum over both gateways of a gauge's series that carry `labels`."""
    total = 0.0
    for url in stack.gateway_urls:
        for metric in text_string_to_metric_families(http_get(f"{url}/metrics")):
            if metric.name == family:
                total += sum(s.value for s in metric.samples if labels.items() <= s.labels.items())
    return total


def gateways_in_flight(stack: VllmStack) -> int:
    """Requests admitted and not yet finished, over both gateways and tenants."""
    return round(gateways_gauge(stack, "slotshift_gateway_requests_in_flight"))


def tenants(stack: VllmStack) -> dict[str, dict[str, int]]:
    """Each tenant's in-flight and queued requests, as the control plane sees them."""
    listed = json.loads(
        grpcurl(stack, "slotshift.v1.AllocationService/ListTenants", data='{"pool": "default"}')
    )["tenants"]
    return {
        t["allocation"]["tenant"]: {
            "in_flight": int(t.get("in_flight", 0)),
            "queued": int(t.get("queued", 0)),
        }
        for t in listed
    }


def wait_at_rest(stack: VllmStack) -> None:
    """Until both tenants hold their nominal shares again."""
    wait_until_sync(
        lambda: limits(stack) == {"A": NOMINAL_SLOTS, "B": NOMINAL_SLOTS},
        timeout_s=30,
        interval_s=0.2,
        message="the stack at rest (nominal limits)",
    )


_SAMPLER_SCRIPT = """
import re, sys, time, urllib.request
pattern = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\\{[^}]*\\})? (\\S+)$", re.M)
url = sys.argv[1]
while True:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    print(sum(float(v) for v in pattern.findall(text)), flush=True)
    time.sleep(0.1)
"""


class Sampler:
    """Samples vLLM's running + waiting until stopped (a context manager), from a process of
    its own: a thread of the test process would share its interpreter lock with the test's own
    work (and the preemption test's clients, which relay every token) and sample far less often."""

    def __init__(self, stack: VllmStack) -> None:
        self.stack = stack
        self.vllm_in_server: list[float] = []
        self.sampled_s = 0.0
        """How long it sampled."""
        self._process: subprocess.Popen[str] | None = None
        self._started_s = 0.0

    def __enter__(self) -> Sampler:
        self._started_s = time.monotonic()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER_SCRIPT, f"{self.stack.vllm_url}/metrics"],
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *_: object) -> None:
        self.sampled_s = time.monotonic() - self._started_s
        process = self._process
        assert process is not None
        process.terminate()
        out, _errors = process.communicate(timeout=30)
        self.vllm_in_server = [float(line) for line in out.split() if line]

    def assert_never_above(self, budget_slots: int) -> None:
        """vLLM's own running + waiting never exceeded `budget_slots`, and the sampler kept
        looking (at least a sample every two seconds) while it ran."""
        # A witness only if it kept looking: a sampler starved of CPU could miss an overrun. It
        # asks every 0.1 s (each scrape costs vLLM's API server, which the load needs), and took
        # 0.9-5 samples a second on two cores shared with vLLM and the load (vLLM's /metrics
        # answers in up to a second while it streams 14 paused-and-resumed requests); half a
        # sample a second is the floor below which this is no witness at all. (A count would
        # not do: how long the load runs depends on the machine.) The exact witness is the
        # emulator's per-step high-water mark (tests/integration), which misses nothing.
        assert len(self.vllm_in_server) >= 0.5 * self.sampled_s, (
            f"{len(self.vllm_in_server)} samples in {self.sampled_s:.1f} s"
        )
        # Not the gateways' sum: two processes cannot be read at one instant, and a slot that
        # moves from one gateway to the other between the two reads is counted twice.
        assert max(self.vllm_in_server) <= budget_slots
