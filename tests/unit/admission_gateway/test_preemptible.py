"""The preemptible relay's text completions (admission_gateway/preemptible.py) against the fake
engine: the prompt's token ids are asked for beside the first attempt, never before admission."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.support import wait_until
from tests.unit.admission_gateway.conftest import StartGateway, auth
from tests.unit.admission_gateway.fake_engine import CONTENT_PIECES, FakeEngine


async def test_a_text_completion_is_answered_while_its_tokenize_call_is_unanswered(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    engine.tokenize_gate = asyncio.Event()
    gateway = await start_gateway(preemptible=("B",))
    body = {"model": "fake", "user": "B", "prompt": "Hi", "max_tokens": 3}
    async with http.post(gateway.url + "/v1/completions", json=body, headers=auth("B")) as answer:
        assert answer.status == 200
        completion = await answer.json()
    # Sent as the client wrote it (the engine tokenizes it as /tokenize would), and answered
    # with /tokenize still waiting: the ids were asked for beside the attempt.
    assert completion["choices"][0]["text"] == "".join(CONTENT_PIECES)
    assert engine.prompts_seen == ["Hi"]
    assert not engine.tokenize_gate.is_set()
    await wait_until(lambda: gateway.admission("B").in_flight == 0, message="slot released")
