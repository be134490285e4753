"""Integration, a real control plane on port 0: with `controlplane.query_token_file` set, the
read-only calls (every AllocationService query, AdminService.GetPoolConfig) answer
UNAUTHENTICATED without a token, or with a wrong one, and answer with a query token (either of
a rotation's two) or the admin token; health and reflection stay open, and grpcurl lists the
services and reads with `-H`. Without the file the queries are open, as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from controlplane.server import ControlPlane
from slotshift.config import ConfigError, SlotshiftConfig, load_config
from slotshift.v1 import admin_pb2, admin_pb2_grpc, query_pb2, query_pb2_grpc
from tests.grpcurl import grpcurl_binary
from tests.integration.stack import start_stack
from tests.support import TEST_KEY_DIGEST_SECRET

pytestmark = pytest.mark.integration

OLD_QUERY_TOKEN = "query-token-old-4b1e"
NEW_QUERY_TOKEN = "query-token-new-9c2d"
ADMIN_TOKEN = "admin-token-77aa"

Metadata = tuple[tuple[str, str], ...]
Call = Callable[[grpc.aio.Channel, Metadata], Awaitable[Any]]


def _bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


def _config(tmp_path: Path, engine_url: str, grpc_port: int, *, query: bool) -> SlotshiftConfig:
    """Loaded from a file, as the services load it: the token files are relative to it."""
    # A rotation under way: two query tokens, a comment and a blank line.
    (tmp_path / "query-tokens").write_text(
        f"# old first, then the new one\n{OLD_QUERY_TOKEN}\n\n{NEW_QUERY_TOKEN}\n"
    )
    (tmp_path / "admin-token").write_text(f"{ADMIN_TOKEN}\n")
    (tmp_path / "key-digest-secret").write_text(f"{TEST_KEY_DIGEST_SECRET}\n")
    query_line = "  query_token_file: query-tokens\n" if query else ""
    (tmp_path / "slotshift.yaml").write_text(
        f"""
pools:
  - name: default
    budget_slots: 8
    engine_url: {engine_url}
    tenants:
      - {{name: A, api_keys: [key-a]}}
      - {{name: B, api_keys: [key-b]}}
tenant_keys:
  key_digest_secret_file: key-digest-secret
controlplane:
  grpc_port: {grpc_port}
  metrics_port: 0
  admin_token_file: admin-token
{query_line}"""
    )
    return load_config(tmp_path / "slotshift.yaml")


async def _start(tmp_path: Path, exits: AsyncExitStack, *, query: bool) -> ControlPlane:
    stack = await start_stack(
        exits, lambda url, port: _config(tmp_path, url, port, query=query), gateways=0
    )
    return stack.control_plane


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    async with AsyncExitStack() as exits:
        yield await _start(tmp_path, exits, query=True)


@pytest.fixture
async def channel(guarded: ControlPlane) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{guarded.grpc_port}") as channel:
        yield channel


async def _get_allocation(channel: grpc.aio.Channel, metadata: Metadata) -> Any:
    stub = query_pb2_grpc.AllocationServiceStub(channel)
    return await stub.GetAllocation(
        query_pb2.GetAllocationRequest(pool="default"), metadata=metadata
    )


async def _list_pools(channel: grpc.aio.Channel, metadata: Metadata) -> Any:
    stub = query_pb2_grpc.AllocationServiceStub(channel)
    return await stub.ListPools(query_pb2.ListPoolsRequest(), metadata=metadata)


async def _list_tenants(channel: grpc.aio.Channel, metadata: Metadata) -> Any:
    stub = query_pb2_grpc.AllocationServiceStub(channel)
    return await stub.ListTenants(query_pb2.ListTenantsRequest(pool="default"), metadata=metadata)


async def _get_decisions(channel: grpc.aio.Channel, metadata: Metadata) -> Any:
    stub = query_pb2_grpc.AllocationServiceStub(channel)
    return await stub.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", limit=5), metadata=metadata
    )


async def _get_pool_config(channel: grpc.aio.Channel, metadata: Metadata) -> Any:
    stub = admin_pb2_grpc.AdminServiceStub(channel)
    return await stub.GetPoolConfig(
        admin_pb2.GetPoolConfigRequest(pool="default"), metadata=metadata
    )


READS = [
    pytest.param(_get_allocation, id="GetAllocation"),
    pytest.param(_list_pools, id="ListPools"),
    pytest.param(_list_tenants, id="ListTenants"),
    pytest.param(_get_decisions, id="GetDecisions"),
    pytest.param(_get_pool_config, id="GetPoolConfig"),
]


@pytest.mark.parametrize("call", READS)
@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param((), id="no-token"),
        pytest.param(_bearer("wrong-token"), id="wrong-token"),
        pytest.param((("authorization", OLD_QUERY_TOKEN),), id="not-bearer"),
        pytest.param(_bearer(OLD_QUERY_TOKEN + "x"), id="token-prefix"),
    ],
)
async def test_reads_without_an_accepted_token_are_refused(
    channel: grpc.aio.Channel, call: Call, metadata: Metadata
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(channel, metadata)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    details = refused.value.details() or ""
    assert "controlplane.query_token_file" in details
    assert OLD_QUERY_TOKEN not in details and NEW_QUERY_TOKEN not in details


@pytest.mark.parametrize("call", READS)
@pytest.mark.parametrize(
    "token",
    [
        pytest.param(OLD_QUERY_TOKEN, id="old-query-token"),
        pytest.param(NEW_QUERY_TOKEN, id="new-query-token"),
        pytest.param(ADMIN_TOKEN, id="admin-token"),
    ],
)
async def test_reads_with_a_query_token_or_the_admin_token_answer(
    channel: grpc.aio.Channel, call: Call, token: str
) -> None:
    reply = await call(channel, _bearer(token))
    assert reply.ByteSize() > 0


async def test_answers_are_the_pool_s(channel: grpc.aio.Channel) -> None:
    tenants = await _list_tenants(channel, _bearer(NEW_QUERY_TOKEN))
    assert {t.allocation.tenant for t in tenants.tenants} == {"A", "B"}
    config = await _get_pool_config(channel, _bearer(ADMIN_TOKEN))
    assert config.budget_slots == 8


async def test_a_query_token_is_not_an_admin_token(channel: grpc.aio.Channel) -> None:
    stub = admin_pb2_grpc.AdminServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.SetPolicy(
            admin_pb2.SetPolicyRequest(pool="default", policy="static"),
            metadata=_bearer(NEW_QUERY_TOKEN),
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    changed = await stub.SetPolicy(
        admin_pb2.SetPolicyRequest(pool="default", policy="static"), metadata=_bearer(ADMIN_TOKEN)
    )
    assert changed.config.policy == "static"


async def test_health_and_reflection_stay_open(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

    call = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    # grpc.aio allows a stream call without an iterator (then write() feeds it); the stubs do not.
    stream = call()  # type: ignore[call-arg]
    await stream.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    listed: reflection_pb2.ServerReflectionResponse = await stream.read()
    await stream.done_writing()
    names = {s.name for s in listed.list_services_response.service}
    assert {"slotshift.v1.AllocationService", "slotshift.v1.AdminService"} <= names


async def _grpcurl(target: str, *args: str) -> tuple[int, str, str]:
    """The real grpcurl, run without blocking the loop the control plane serves on."""
    process = await asyncio.create_subprocess_exec(
        grpcurl_binary(),
        "-plaintext",
        *args[:-1],
        target,
        args[-1],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_grpcurl_lists_without_a_token_and_reads_with_one(guarded: ControlPlane) -> None:
    target = f"127.0.0.1:{guarded.grpc_port}"
    status, listed, _ = await _grpcurl(target, "list")
    assert status == 0
    assert "slotshift.v1.AllocationService" in listed.split()

    read = ("-d", '{"pool": "default"}', "slotshift.v1.AllocationService/ListTenants")
    status, _, refused = await _grpcurl(target, *read)
    assert status != 0
    assert "Unauthenticated" in refused

    status, answered, _ = await _grpcurl(
        target, "-H", f"authorization: Bearer {NEW_QUERY_TOKEN}", *read
    )
    assert status == 0
    assert {t["allocation"]["tenant"] for t in json.loads(answered)["tenants"]} == {"A", "B"}


async def test_without_a_query_token_file_the_reads_are_open(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        control_plane = await _start(tmp_path, exits, query=False)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.grpc_port}") as channel:
            for param in READS:
                (call,) = param.values
                assert callable(call)
                reply = await call(channel, ())
                assert reply.ByteSize() > 0


async def test_a_query_token_file_without_a_token_stops_the_start(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        config = _config(tmp_path, "http://127.0.0.1:1", 0, query=True)
        (tmp_path / "query-tokens").write_text("# nothing yet\n\n")
        with pytest.raises(ConfigError, match=r"controlplane\.query_token_file: .* holds no token"):
            await start_stack(exits, lambda url, port: config, gateways=0)
