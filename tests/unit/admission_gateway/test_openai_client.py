"""The official openai client works against the gateway, streamed and not, errors included."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
import pytest_asyncio

from admission_gateway.gateway import AdmissionGateway
from admission_gateway.gateway_state import TenantLimit
from tests.unit.admission_gateway.conftest import KEYS, StartGateway

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]


@pytest_asyncio.fixture
async def gateway(start_gateway: StartGateway) -> AdmissionGateway:
    return await start_gateway(queue_max_depth=0)


@pytest_asyncio.fixture
async def client(gateway: AdmissionGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key=KEYS["A"], max_retries=0
    ) as instance:
        yield instance


async def test_chat_completion(client: openai.AsyncOpenAI, gateway: AdmissionGateway) -> None:
    completion = await client.chat.completions.create(model="fake", messages=MESSAGES, user="A")
    assert completion.choices[0].message.content == "Hello, world"
    assert gateway.admission("A").completed_total == 1


async def test_streamed_chat_completion(
    client: openai.AsyncOpenAI, gateway: AdmissionGateway
) -> None:
    stream = await client.chat.completions.create(
        model="fake", messages=MESSAGES, user="A", stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream]
    assert "".join(pieces) == "Hello, world"
    assert len(gateway.state.tenants["A"].ttft) == 1


async def test_streamed_completion(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(model="fake", prompt="Hi", user="A", stream=True)
    assert "".join([chunk.choices[0].text async for chunk in stream]) == "Hello, world"


async def test_models(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [model.id for model in models.data] == ["fake"]


async def test_an_unknown_key_is_an_authentication_error(gateway: AdmissionGateway) -> None:
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="wrong", max_retries=0
    ) as stranger:
        with pytest.raises(openai.AuthenticationError) as caught:
            await stranger.chat.completions.create(model="fake", messages=MESSAGES)
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


async def test_a_full_queue_is_a_rate_limit_error(
    client: openai.AsyncOpenAI, gateway: AdmissionGateway
) -> None:
    gateway.state.apply_allocation(1, [TenantLimit("B", 4, 4)])
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="fake", messages=MESSAGES)
    assert caught.value.response.headers["Retry-After"] == "1"
    assert caught.value.code == "queue_full"
