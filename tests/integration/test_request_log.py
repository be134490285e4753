"""Integration, real servers on port 0 in one process: two gateways with the request log on, in
front of the emulator, serve the official openai client; their logs hold one valid line per
finished request with the counts the engine reported, merge by arrival into a replay schedule,
and never hold a prompt, an output, a session id in clear or an API key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path

import aiohttp
import openai
import pytest

from slotshift.config import SlotshiftConfig, parse_config
from slotshift.request_log import (
    Outcome,
    RequestLogWriter,
    RequestRecord,
    SessionHasher,
    merge_logs,
    read_log,
)
from slotshift_tools.replay import replay_schedule
from tests.integration.stack import Stack, start_stack
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY_A = "sk-reqlog-tenant-a-5d1e90"
KEY_B = "sk-reqlog-tenant-b-c04a7f"
SESSION_KEY = "reqlog-session-key-7b3e2f41a9"
PROMPT = "The secret prompt about aardvarks"
USER = "alice@example.com"
SESSION = "session-of-bob-42"


def _config(engine_url: str, grpc_port: int, folder: Path) -> SlotshiftConfig:
    return parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 8,
                    "decision_period_s": 0.1,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": [KEY_A]},
                        {"name": "B", "api_keys": [KEY_B]},
                    ],
                }
            ],
            "controlplane": {"grpc_port": grpc_port, "metrics_port": 0},
            "gateway": {
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "fallback_replicas": 2,
                "report_interval_s": 0.05,
                "request_log": {
                    "log_file": str(folder / "requests-{gateway_id}.jsonl"),
                    "session_key_file": str(folder / "session-key"),
                },
            },
            "engine_sim": {"port": 0},
        }
    )


def _contents(folder: Path) -> bytes:
    """Every request log file in `folder` (rotated ones too), together."""
    return b"".join(p.read_bytes() for p in sorted(folder.glob("requests-*")))


def _flushed(log: RequestLogWriter, lines: int) -> bool:
    return log.buffered == 0 and log.written_total == lines


def _write_key(folder: Path) -> None:
    (folder / "session-key").write_text(SESSION_KEY + "\n")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    _write_key(tmp_path)
    async with AsyncExitStack() as exits:
        yield await start_stack(exits, lambda url, port: _config(url, port, tmp_path), gateways=2)


async def test_the_logs_of_two_gateways_record_each_request_and_no_content(
    stack: Stack, tmp_path: Path
) -> None:
    first, second = stack.gateways
    async with (
        openai.AsyncOpenAI(base_url=first.url + "/v1", api_key=KEY_A, max_retries=0) as a,
        openai.AsyncOpenAI(base_url=second.url + "/v1", api_key=KEY_B, max_retries=0) as b,
    ):
        served = (await a.models.list()).data[0].id
        chat = await a.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=5,
            user=USER,
        )
        assert chat.usage is not None
        stream = await a.completions.create(
            model=served,
            prompt=PROMPT,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Session-Id": SESSION},
        )
        streamed_usage = [chunk.usage async for chunk in stream if chunk.usage is not None]
        plain_stream = await b.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=4,
            stream=True,
        )
        plain_chunks = [chunk async for chunk in plain_stream]
        chat_text = "".join(c.choices[0].delta.content or "" for c in plain_chunks if c.choices)
    async with aiohttp.ClientSession() as session:
        refused = await session.post(
            first.url + "/v1/completions",
            data=b"{not json",
            headers={"Authorization": f"Bearer {KEY_A}"},
        )
        assert refused.status == 400
        stranger = await session.post(
            first.url + "/v1/completions",
            json={"model": served, "prompt": PROMPT},
            headers={"Authorization": "Bearer sk-not-a-key"},
        )
        assert stranger.status == 401

    paths = []
    for gateway, lines in ((first, 3), (second, 1)):
        log = gateway.request_log
        assert log is not None
        await wait_until(
            partial(_flushed, log, lines), message=f"{gateway.gateway_id}'s records flushed"
        )
        assert log.path.parent == tmp_path
        assert log.path.name == f"requests-{gateway.gateway_id}.jsonl"
        paths.append(log.path)

    first_records, second_records = (list(read_log(path)) for path in paths)
    # The unauthenticated request has no tenant, so no line.
    assert [r.outcome for r in first_records] == [
        Outcome.COMPLETED,
        Outcome.COMPLETED,
        Outcome.INVALID,
    ]
    assert [r.outcome for r in second_records] == [Outcome.COMPLETED]

    hasher = SessionHasher(SESSION_KEY.encode())
    chat_record, stream_record, invalid = first_records
    assert (chat_record.tenant, chat_record.gateway, chat_record.pool) == ("A", "gw-0", "default")
    assert chat_record.route == "/v1/chat/completions"
    assert (chat_record.streamed, chat_record.max_tokens, chat_record.status) == (False, 5, 200)
    assert chat_record.prompt_tokens == chat.usage.prompt_tokens
    assert chat_record.output_tokens == chat.usage.completion_tokens
    assert chat_record.output_tokens_from == "usage"
    assert chat_record.session == hasher.session("A", USER)
    assert chat_record.queue_wait_ms is not None
    assert chat_record.ttft_ms is None
    assert chat_record.e2e_ms > 0

    assert (stream_record.streamed, stream_record.max_tokens) == (True, 6)
    assert len(streamed_usage) == 1
    assert stream_record.prompt_tokens == streamed_usage[0].prompt_tokens
    assert stream_record.output_tokens == streamed_usage[0].completion_tokens == 6
    assert stream_record.output_tokens_from == "usage"
    assert stream_record.session == hasher.session("A", SESSION)
    assert stream_record.ttft_ms is not None
    assert 0 < stream_record.ttft_ms <= stream_record.e2e_ms

    (plain,) = second_records
    assert (plain.tenant, plain.gateway, plain.streamed) == ("B", "gw-1", True)
    # The client asked for no usage: the gateway asked the engine for it, counted it, and kept
    # the usage event from the client.
    assert plain.output_tokens_from == "usage"
    assert plain.output_tokens == 4
    assert chat_text
    assert plain.prompt_tokens is not None and plain.prompt_tokens > 0
    assert all(c.choices and c.usage is None for c in plain_chunks)
    assert plain.session is None

    assert (invalid.reason, invalid.status, invalid.streamed) == ("invalid_json", 400, None)
    assert invalid.queue_wait_ms is None

    everything = _contents(tmp_path)
    for secret in (KEY_A, KEY_B, SESSION_KEY, PROMPT, "aardvark", USER, SESSION, chat_text):
        assert secret.encode() not in everything, secret
    if chat.choices[0].message.content:
        assert chat.choices[0].message.content.encode() not in everything

    merged = list(merge_logs(paths))
    assert [r.arrival_unix_s for r in merged] == sorted(r.arrival_unix_s for r in merged)
    assert len(merged) == 4
    schedule = replay_schedule(merged, default_prompt_tokens=16)
    assert schedule.left_out == {"invalid": 1}
    assert [r.output_tokens for r in schedule.tenants["A"].requests] == [
        chat.usage.completion_tokens,
        6,
    ]
    assert [(r.prompt_tokens, r.output_tokens) for r in schedule.tenants["B"].requests] == [(16, 4)]


async def test_stopping_the_gateway_writes_its_last_records(stack: Stack) -> None:
    gateway = stack.gateways[0]
    async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=KEY_A, max_retries=0) as a:
        served = (await a.models.list()).data[0].id
        await a.completions.create(model=served, prompt="x", max_tokens=2)
    log = gateway.request_log
    assert log is not None
    await gateway.stop()
    records: list[RequestRecord] = list(read_log(log.path))
    assert [(r.outcome, r.output_tokens) for r in records] == [(Outcome.COMPLETED, 2)]
    assert log.dropped_total == 0
