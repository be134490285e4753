"""End to end: the local fleet demo (deploy/local/fleet.yaml) started with `slotshift up` as real
processes: three emulators (two replicas of one model, one engine of another), one control plane,
two gateways and an agent watching the three engines. One base URL serves both models to the
official openai client, each tenant sees its own models, and requests of the replicated model
spread over its replicas."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from slotshift_tools.metrics_scrape import parse_samples
from tests.e2e.conftest import ROOT
from tests.e2e.service_processes import grpc_serving, http_ok, slotshift_up
from tests.support import free_port

pytestmark = pytest.mark.e2e

FLEET_CONFIG = ROOT / "deploy" / "local" / "fleet.yaml"
SMALL = "qwen2.5-3b"
LARGE = "qwen2.5-7b"
POOLS = ("small-a", "small-b", "large")


@dataclass
class _Fleet:
    gateway_urls: list[str]
    engine_urls: dict[str, str]
    log: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Fleet]:
    engines = {pool: free_port() for pool in POOLS}
    cp, cp_metrics, agent_metrics, gw0, gw1 = (free_port() for _ in range(5))
    settings: dict[str, object] = {
        "controlplane.grpc_port": cp,
        "controlplane.metrics_port": cp_metrics,
        "gateway.controlplane_target": f"127.0.0.1:{cp}",
        "agent.controlplane_target": f"127.0.0.1:{cp}",
        "agent.metrics_port": agent_metrics,
        "local_stack.gateway_ports": f"[{gw0}, {gw1}]",
    }
    for index, pool in enumerate(POOLS):
        url = f"http://127.0.0.1:{engines[pool]}"
        settings[f"pools.{index}.engine_url"] = url
        settings[f"agent.engines.{index}.metrics_url"] = f"{url}/metrics"
    gateway_urls = [f"http://127.0.0.1:{gw0}", f"http://127.0.0.1:{gw1}"]

    def ready() -> bool:
        return (
            grpc_serving(f"127.0.0.1:{cp}")
            and all(http_ok(f"{url}/ready") for url in gateway_urls)
            and http_ok(f"http://127.0.0.1:{agent_metrics}/health")
        )

    log = tmp_path_factory.mktemp("fleet") / "slotshift-up.log"
    with slotshift_up(
        log,
        config=FLEET_CONFIG,
        settings=settings,
        ready=ready,
        ready_timeout_s=90,
        stop_timeout_s=60,
    ):
        yield _Fleet(
            gateway_urls,
            {pool: f"http://127.0.0.1:{port}" for pool, port in engines.items()},
            log,
        )


def _client(fleet: _Fleet, key: str, gateway: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet.gateway_urls[gateway]}/v1", api_key=key, max_retries=0)


def _completed(engine_url: str) -> float:
    """Requests the engine finished, from its vLLM metrics."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=5) as answer:
        samples = parse_samples(answer.read().decode())
    return sum(value for _, value in samples.get("vllm:request_success_total", []))


def test_one_base_url_serves_both_models_and_each_tenant_sees_its_own(fleet: _Fleet) -> None:
    assert [m.id for m in _client(fleet, "fleet-key-b").models.list()] == [SMALL, LARGE]
    assert [m.id for m in _client(fleet, "fleet-key-a").models.list()] == [SMALL]
    assert [m.id for m in _client(fleet, "fleet-key-c", 1).models.list()] == [LARGE]
    client = _client(fleet, "fleet-key-b", 1)
    for model in (SMALL, LARGE):
        answer = client.completions.create(
            model=model, prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert answer.model == model
        assert answer.usage is not None and answer.usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError):
        _client(fleet, "fleet-key-c").completions.create(model=SMALL, prompt="Hi", max_tokens=2)


def test_the_replicated_models_requests_take_turns_over_its_replicas(fleet: _Fleet) -> None:
    before = {pool: _completed(url) for pool, url in fleet.engine_urls.items()}
    client = _client(fleet, "fleet-key-a")
    for _ in range(20):
        client.completions.create(
            model=SMALL, prompt="Hello", max_tokens=2, extra_body={"ignore_eos": True}
        )
    served = {pool: _completed(url) - before[pool] for pool, url in fleet.engine_urls.items()}
    assert served["large"] == 0
    assert served["small-a"] + served["small-b"] == 20
    assert 8 <= served["small-a"] <= 12, served
