"""Property-based fuzzing of the gateway's HTTP front and the control plane's gRPC messages,
against real processes: no crash, no 5xx for bad input, no slot leak."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slotshift.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, query_pb2, query_pb2_grpc
from tests.e2e.service_processes import ServiceProcesses, grpc_serving, http_ok, scrape, wait_ready
from tests.support import free_port, wait_until_sync

pytestmark = pytest.mark.e2e

MAX_BODY_BYTES = 4096


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    engine, grpc_port, metrics, gateway = free_port(), free_port(), free_port(), free_port()
    config = {
        "pools": [
            {
                "name": "default",
                "budget_slots": 8,
                "engine_url": f"http://127.0.0.1:{engine}",
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 1},
                    {"name": "B", "api_keys": ["key-b"], "floor_slots": 1},
                ],
            }
        ],
        "controlplane": {"grpc_port": grpc_port, "metrics_port": metrics},
        "gateway": {
            "port": gateway,
            "controlplane_target": f"127.0.0.1:{grpc_port}",
            "max_body_bytes": MAX_BODY_BYTES,
            "queue_timeout_s": 2.0,
        },
        "engine_sim": {"port": engine},
    }
    services = ServiceProcesses(tmp_path_factory.mktemp("fuzz"), config)
    try:
        services.start("engine", "engine-sim")
        wait_ready(lambda: http_ok(f"http://127.0.0.1:{engine}/health"), "the emulator")
        services.start("controlplane", "controlplane")
        wait_ready(lambda: grpc_serving(f"127.0.0.1:{grpc_port}"), "the control plane")
        services.start("gateway", "gateway", "--gateway-id", "gw-fuzz")
        wait_ready(lambda: http_ok(f"http://127.0.0.1:{gateway}/ready"), "the gateway")
        yield {
            "gateway": f"http://127.0.0.1:{gateway}",
            "grpc": f"127.0.0.1:{grpc_port}",
            # The stream fuzzing comes from an authenticated peer: what is fuzzed is the
            # messages, not the door (tests/integration/test_stream_auth.py).
            "gateway_token": services.stream_tokens.gateway_token,
        }
        assert services.running("gateway"), services.log("gateway")
        assert services.running("controlplane"), services.log("controlplane")
    finally:
        services.close()


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.read()
        return int(error.code)


def _slots_held(gateway: str) -> float:
    values = scrape(f"{gateway}/metrics")
    return sum(
        v
        for k, v in values.items()
        if k.startswith("slotshift_gateway_") and ("in_flight" in k or "queued" in k)
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
plausible_requests = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["Qwen/Qwen2.5-3B-Instruct", "other", ""]) | json_values,
        "prompt": st.text(max_size=50) | json_values,
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "system", "x"]),
                    "content": st.text(max_size=20) | json_values,
                }
            ),
            max_size=3,
        )
        | json_values,
        "max_tokens": st.integers(-5, 40) | json_values,
        "stream": st.booleans() | json_values,
        "ignore_eos": st.booleans(),
        "n": st.integers(0, 3),
    },
)
bodies = (
    plausible_requests.map(lambda d: json.dumps(d).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=200)
    | st.just(b"x" * (MAX_BODY_BYTES + 1))
)
authorizations = st.sampled_from(
    ["Bearer key-a", "Bearer key-b", "Bearer nope", "Basic key-a", "", "Bearer "]
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    body=bodies,
    authorization=authorizations,
)
def test_http_front_never_crashes_and_never_leaks_a_slot(
    stack: dict[str, str], path: str, body: bytes, authorization: str
) -> None:
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    status = _post(stack["gateway"] + path, body, headers)
    assert status in {200, 400, 401, 404, 413, 422}, f"unexpected {status} for {body[:80]!r}"
    if not authorization.startswith("Bearer key-"):
        assert status == 401
    if len(body) > MAX_BODY_BYTES and authorization.startswith("Bearer key-"):
        assert status == 413
    wait_until_sync(
        lambda: _slots_held(stack["gateway"]) == 0, timeout_s=10, message="slots released"
    )


tenant_demands = st.builds(
    common_pb2.TenantDemand,
    tenant=st.sampled_from(["A", "B", "", "C", "x" * 300]),
    in_flight=st.integers(-(2**31), 2**31 - 1),
    queued=st.integers(-(2**31), 2**31 - 1),
    limit_slots=st.integers(-(2**31), 2**31 - 1),
)
gateway_messages = st.one_of(
    st.builds(
        lambda t, v: gateway_pb2.GatewayMessage(
            demand=gateway_pb2.DemandReport(
                pool="default", gateway_id="fz", applied_version=v, tenants=t
            )
        ),
        st.lists(tenant_demands, max_size=4),
        st.integers(-(2**63), 2**63 - 1),
    ),
    st.builds(
        lambda t, v: gateway_pb2.GatewayMessage(
            ack=gateway_pb2.AllocationAck(pool="default", gateway_id="fz", version=v, tenants=t)
        ),
        st.lists(tenant_demands, max_size=4),
        st.integers(-(2**63), 2**63 - 1),
    ),
    st.just(
        gateway_pb2.GatewayMessage(hello=gateway_pb2.GatewayHello(pool="default", gateway_id="fz"))
    ),
    st.just(gateway_pb2.GatewayMessage()),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    hello=st.builds(
        gateway_pb2.GatewayHello,
        pool=st.sampled_from(["default", "", "nope"]),
        gateway_id=st.sampled_from(["fz", ""]),
        applied_version=st.integers(0, 2**40),
        tenants=st.lists(tenant_demands, max_size=3),
    ),
    messages=st.lists(gateway_messages, max_size=6),
)
def test_gateway_stream_survives_any_messages(
    stack: dict[str, str],
    hello: gateway_pb2.GatewayHello,
    messages: list[gateway_pb2.GatewayMessage],
) -> None:
    with grpc.insecure_channel(stack["grpc"]) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        call = stub.Connect(
            iter([gateway_pb2.GatewayMessage(hello=hello), *messages]),
            timeout=2,
            metadata=(("authorization", f"Bearer {stack['gateway_token']}"),),
        )
        failure: grpc.RpcError | None = None
        try:
            for _ in call:
                pass
        except grpc.RpcError as error:
            failure = error
        queries = query_pb2_grpc.AllocationServiceStub(channel)
        allocation = queries.GetAllocation(
            query_pb2.GetAllocationRequest(pool="default"), timeout=5
        )
    if failure is not None:
        code = failure.code()
        assert code in {
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
        }, failure
        if code in {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}:
            field = (failure.details() or "").split(":")[0]
            assert field in {"hello", "hello.gateway_id", "hello.pool"}
    assert sum(t.limit_slots for t in allocation.tenants) == 8
    for gateway in allocation.gateways:
        for limit in gateway.tenants:
            assert 0 <= limit.limit_slots <= limit.target_slots <= 8
    assert grpc_serving(stack["grpc"])
