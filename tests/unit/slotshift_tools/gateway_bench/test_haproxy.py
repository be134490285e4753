"""The HAProxy peer's config: one backend per tenant, its key's ACL, its static share."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slotshift_tools.gateway_bench.haproxy import (
    HaproxyTenant,
    find_haproxy,
    haproxy_config,
    tenants_of,
)


def _config(tenants: list[HaproxyTenant]) -> str:
    return haproxy_config(
        bind_host="127.0.0.1",
        bind_port=18080,
        engine_host="127.0.0.1",
        engine_port=18000,
        tenants=tenants,
    )


TENANTS = tenants_of({"a": "key-a", "b": "key-b"}, {"a": 24, "b": 8})


def test_each_tenant_has_a_backend_capped_at_its_share_picked_by_its_key() -> None:
    text = _config(TENANTS)
    lines = [line.strip() for line in text.splitlines()]
    assert 'acl key_a req.hdr(authorization) -m str "Bearer key-a"' in lines
    assert 'acl key_b req.hdr(authorization) -m str "Bearer key-b"' in lines
    assert "use_backend tenant_a if key_a" in lines
    assert "use_backend tenant_b if key_b" in lines
    backend_a = text.split("backend tenant_a\n")[1].split("\n\n")[0]
    backend_b = text.split("backend tenant_b\n")[1].split("\n\n")[0]
    assert backend_a.strip() == "server engine 127.0.0.1:18000 maxconn 24"
    assert backend_b.strip() == "server engine 127.0.0.1:18000 maxconn 8"
    assert "option http-no-delay" in lines
    assert "bind 127.0.0.1:18080" in lines
    assert "default_backend unknown_key" in lines
    assert "http-request deny deny_status 401" in lines


def test_a_share_of_zero_still_gets_one_connection() -> None:
    [tenant] = tenants_of({"a": "k"}, {"a": 0})
    assert tenant.maxconn == 1


@pytest.mark.parametrize(
    "tenant",
    [
        pytest.param(HaproxyTenant("a", 'k"ey', 2), id="quote-in-key"),
        pytest.param(HaproxyTenant("a", "k ey", 2), id="space-in-key"),
        pytest.param(HaproxyTenant("a b", "key", 2), id="space-in-name"),
        pytest.param(HaproxyTenant("a", "key", 0), id="no-connection"),
    ],
)
def test_what_cannot_be_written_as_it_is_is_refused(tenant: HaproxyTenant) -> None:
    with pytest.raises(ValueError, match="tenant"):
        _config([tenant])


def test_haproxy_itself_accepts_the_config(tmp_path: Path) -> None:
    binary = find_haproxy()
    if binary is None:
        pytest.skip("haproxy is not installed")
    path = tmp_path / "haproxy.cfg"
    path.write_text(_config(TENANTS))
    result = subprocess.run(
        [binary, "-c", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
