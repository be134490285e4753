"""End to end: the local fleet demo (deploy/local/fleet.yaml) started with `slotshift up` as real
processes: three emulators (two replicas of one model, one engine of another), one control plane,
two gateways and an agent watching the three engines. One base URL serves both models to the
official openai client, each tenant sees its own models, and requests of the replicated model
spread over its replicas."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest

from slotshift_tools.engine_probe import requests_inside
from slotshift_tools.metrics_scrape import parse_samples
from tests.e2e.conftest import ROOT
from tests.e2e.service_processes import grpc_serving, http_ok, slotshift_up
from tests.support import free_port, wait_until

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


def _pid_of(log: Path, service: str) -> int:
    """The pid `slotshift up` last logged for `service`."""
    pattern = re.compile(rf"\b{re.escape(service)} is ready(?: again)? \(pid (\d+)\)")
    return int(pattern.findall(log.read_text(errors="replace"))[-1])


async def test_a_killed_replica_under_load_fails_no_request_of_the_other_model(
    fleet: _Fleet,
) -> None:
    """Closed-loop load of both models through both gateways while each engine's requests are
    sampled: no engine ever holds more than its pool's budget; kill -9 one replica of the small
    model, and the large model's requests never fail while the small model's move to the other
    replica (`slotshift up` restarts the killed one meanwhile)."""
    budgets = {"small-a": 48, "small-b": 48, "large": 32}
    outcomes: dict[str, list[int | str]] = {SMALL: [], LARGE: []}
    inside: dict[str, list[int]] = {pool: [] for pool in POOLS}
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession, url: str, model: str) -> None:
        body = {"model": model, "prompt": "load", "max_tokens": 16, "ignore_eos": True}
        headers = {"Authorization": "Bearer fleet-key-b"}
        while not stop.is_set():
            try:
                async with session.post(f"{url}/v1/completions", json=body, headers=headers) as r:
                    await r.read()
                    outcomes[model].append(r.status)
            except aiohttp.ClientError as exc:
                outcomes[model].append(type(exc).__name__)
                await asyncio.sleep(0.05)

    async def sample(session: aiohttp.ClientSession, pool: str) -> None:
        while not stop.is_set():
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{fleet.engine_urls[pool]}/metrics") as r:
                    inside[pool].append(requests_inside(await r.text()))
            await asyncio.sleep(0.02)

    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        asyncio.TaskGroup() as tasks,
    ):
        for url in fleet.gateway_urls:
            for model in (SMALL, LARGE):
                for index in range(6):
                    tasks.create_task(client(session, url, model), name=f"{model}-{index}")
        for pool in POOLS:
            tasks.create_task(sample(session, pool), name=f"sample-{pool}")
        await wait_until(lambda: len(outcomes[SMALL]) > 60, timeout_s=30, message="load")
        os.kill(_pid_of(fleet.log, "engine-sim-small-a"), signal.SIGKILL)
        lost_at = len(outcomes[SMALL])
        await wait_until(
            lambda: outcomes[SMALL][lost_at:].count(200) > 100,
            timeout_s=30,
            message="the small model served by the other replica",
        )
        stop.set()
    assert set(outcomes[LARGE]) == {200}, "no request of the other model fails"
    assert all(max(inside[pool]) <= budgets[pool] for pool in POOLS), {
        pool: max(inside[pool]) for pool in POOLS
    }
    lost = [o for o in outcomes[SMALL] if o != 200]
    # The requests running on the killed engine (up to what its share at two gateways let in),
    # and those that reached for it before the gateways marked it down.
    assert set(lost) <= {502}, set(lost)
    assert outcomes[SMALL][-20:] == [200] * 20
