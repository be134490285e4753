"""Integration, real servers on port 0 in one process: two emulators serving two models, one
control plane with a pool for each, and two gateways fronting both. One base URL serves both
models to the official openai client; a tenant sees and reaches only the models of its pools;
unknown models get OpenAI's 404, and a request naming no model goes to the tenant's only one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import openai
import pytest

from slotshift.config import SlotshiftConfig, parse_config
from tests.integration.stack import Fleet, start_fleet

pytestmark = pytest.mark.integration

KEY_A = "sk-routing-tenant-a-3f9c1e"
KEY_B = "sk-routing-tenant-b-8d2a70"
LLAMA = "llama-3b"
QWEN = "qwen-7b"


def _config(urls: dict[str, str], grpc_port: int) -> SlotshiftConfig:
    """urls: pool -> its engine's URL."""
    tenant_a = {"name": "A", "api_keys": [KEY_A]}
    return parse_config(
        {
            "pools": [
                {
                    "name": "llama",
                    "models": [LLAMA, "llama"],
                    "budget_slots": 8,
                    "engine_url": urls["llama"],
                    "tenants": [tenant_a, {"name": "B", "api_keys": [KEY_B]}],
                },
                {
                    "name": "qwen",
                    "models": [QWEN],
                    "budget_slots": 4,
                    "engine_url": urls["qwen"],
                    "tenants": [tenant_a],
                },
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "gateway": {
                "pools": ["llama", "qwen"],
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "fallback_replicas": 2,
                "report_interval_s": 0.05,
            },
            "engine_sim": {"port": 0},
        }
    )


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with AsyncExitStack() as exits:
        models = {"llama": LLAMA, "qwen": QWEN}
        yield await start_fleet(exits, _config, models, gateways=2)


async def test_one_base_url_serves_both_models_to_the_openai_client(fleet: Fleet) -> None:
    gateway = fleet.gateways[0]
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key=KEY_A, max_retries=0
    ) as client:
        listed = [m.id for m in (await client.models.list()).data]
        assert listed == [LLAMA, "llama", QWEN]
        for model in (LLAMA, QWEN):
            answer = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert answer.model == model, "the engine that serves the model answered"
            stream = await client.completions.create(
                model=model, prompt="hi", max_tokens=4, stream=True
            )
            assert [chunk async for chunk in stream]
    completed = {pool: engine.completed_count for pool, engine in fleet.engines.items()}
    assert completed == {"llama": 2, "qwen": 2}
    assert gateway.states["qwen"].tenants["A"].admission.counts().completed_total == 2


async def test_a_tenant_reaches_only_its_models_and_unknown_ones_are_not_found(
    fleet: Fleet,
) -> None:
    gateway = fleet.gateways[1]
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key=KEY_B, max_retries=0
    ) as client:
        assert [m.id for m in (await client.models.list()).data] == [LLAMA, "llama"]
        for model in (QWEN, "gpt-4"):
            with pytest.raises(openai.NotFoundError) as refused:
                await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            error = refused.value.body
            assert isinstance(error, dict)
            assert error["code"] == "model_not_found" and error["param"] == "model"
    assert fleet.engines["qwen"].completed_count == 0


async def test_no_model_goes_to_the_tenants_only_one_and_is_refused_with_several(
    fleet: Fleet,
) -> None:
    url = fleet.gateways[0].url + "/v1/completions"
    body = {"prompt": "hi", "max_tokens": 3}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers={"Authorization": f"Bearer {KEY_B}"}) as r:
            assert r.status == 200
            assert (await r.json())["model"] == LLAMA
        async with http.post(url, json=body, headers={"Authorization": f"Bearer {KEY_A}"}) as r:
            assert r.status == 400
            error = (await r.json())["error"]
            assert error["code"] == "missing_model" and error["param"] == "model"
            assert QWEN in error["message"]
