"""The gateway as a whole: health, readiness, the shutdown order, the control plane, main.run."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from admission_gateway.gateway import AdmissionGateway
from admission_gateway.main import run
from slotshift.config import ConfigError
from tests.support import free_port, wait_until
from tests.unit.admission_gateway.conftest import StartGateway, auth, make_config
from tests.unit.admission_gateway.fake_control_plane import FakeControlPlane, serve
from tests.unit.admission_gateway.fake_engine import FakeEngine

COMPLETION = {"model": "fake", "user": "A", "prompt": "Hi"}


async def status_of(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as response:
        return response.status


async def test_health_and_readiness(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway()
    assert await status_of(http, gateway.url + "/health") == 200
    assert await status_of(http, gateway.url + "/ready") == 200


async def test_shutdown_refuses_new_work_and_drains_running_requests(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(fallback_replicas=4)  # 1 slot per tenant
    engine.gate = asyncio.Event()

    async def complete() -> tuple[int, str | None]:
        async with http.post(
            gateway.url + "/v1/completions", json=COMPLETION, headers=auth("A")
        ) as response:
            body = await response.json()
            return response.status, body.get("error", {}).get("code")

    running = asyncio.create_task(complete())
    await wait_until(lambda: engine.in_flight["A"] == 1)
    queued = asyncio.create_task(complete())
    await wait_until(lambda: gateway.admission("A").queued == 1)

    stopping = asyncio.create_task(gateway.stop())
    assert await queued == (503, "shutting_down")
    assert await status_of(http, gateway.url + "/ready") == 503
    assert await status_of(http, gateway.url + "/health") == 200
    assert await complete() == (503, "shutting_down")
    assert not stopping.done()
    assert gateway.admission("A").in_flight == 1

    engine.gate.set()
    assert await running == (200, None)
    await stopping
    assert gateway.admission("A").in_flight == 0


async def test_shutdown_cuts_off_requests_that_outlast_the_drain(
    start_gateway: StartGateway, engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(drain_timeout_s=0.1)
    engine.behaviour = "hang"
    hanging = asyncio.create_task(
        http.post(gateway.url + "/v1/completions", json=COMPLETION, headers=auth("A"))
    )
    await wait_until(lambda: engine.in_flight["A"] == 1)
    await gateway.stop()
    results = await asyncio.gather(hanging, return_exceptions=True)
    assert isinstance(results[0], aiohttp.ClientError)
    assert gateway.admission("A").in_flight == 0
    await wait_until(lambda: engine.aborted == 1)


async def test_limits_pushed_by_the_control_plane_show_in_metrics(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    fake = FakeControlPlane()
    server, port = await serve(fake)
    try:
        gateway = await start_gateway(controlplane_target=f"127.0.0.1:{port}")
        await wait_until(lambda: bool(fake.sessions and fake.sessions[0].received))
        assert fake.sessions[0].received[0].hello.gateway_id == "gw-test"
        await fake.sessions[0].push(3, gateway_id="gw-test", A=(5, 5), B=(2, 1))
        await wait_until(lambda: gateway.state.applied_version == 3)
        async with http.get(gateway.url + "/metrics") as response:
            lines = (await response.text()).splitlines()
        assert 'slotshift_gateway_allocation_version{pool="p"} 3.0' in lines
        assert 'slotshift_gateway_controlplane_connected{pool="p"} 1.0' in lines
        assert 'slotshift_gateway_tenant_limit_slots{pool="p",tenant="B"} 1.0' in lines
        assert 'slotshift_gateway_tenant_target_slots{pool="p",tenant="B"} 2.0' in lines
        await gateway.stop()
    finally:
        await server.stop(None)


async def test_run_serves_until_stopped_and_names_itself_after_host_and_port(
    engine: FakeEngine, http: aiohttp.ClientSession
) -> None:
    fake = FakeControlPlane()
    server, controlplane_port = await serve(fake)
    port = free_port()
    config = make_config(engine.url, controlplane_target=f"127.0.0.1:{controlplane_port}")
    stop = asyncio.Event()
    service = asyncio.create_task(run(config, stop, port=port))
    try:
        url = f"http://127.0.0.1:{port}"

        async def healthy() -> bool:
            try:
                return await status_of(http, url + "/health") == 200
            except aiohttp.ClientConnectionError:
                return False

        await wait_until(healthy, message="gateway healthy")
        await wait_until(lambda: bool(fake.sessions and fake.sessions[0].received))
        hello = fake.sessions[0].received[0].hello
        assert hello.gateway_id == f"{socket.gethostname()}:{port}"
        stop.set()
        await asyncio.wait_for(service, timeout=5)
    finally:
        stop.set()
        await asyncio.gather(service, return_exceptions=True)
        await server.stop(None)


async def test_an_unknown_pool_is_a_configuration_error() -> None:
    config = make_config("http://unused", pool="nope")
    with pytest.raises(ConfigError, match="nope"):
        AdmissionGateway(config)


async def test_a_port_in_use_fails_start_and_leaves_nothing_open(
    start_gateway: StartGateway, engine: FakeEngine
) -> None:
    first = await start_gateway()
    second = AdmissionGateway(make_config(engine.url), port=first.port)
    with pytest.raises(OSError, match="in use"):
        await second.start()
