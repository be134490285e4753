"""HAProxy as the bench's C-proxy peer: its config (pure) and where its binary is.

One frontend; one backend per tenant, picked by the request's Authorization header (an ACL on
`req.hdr(authorization)` per key), whose one server (the engine) takes at most the tenant's
static share of connections at once (`maxconn`: the rest wait in the backend's queue, as a
tenant's requests wait at a gateway); a request with no known key is refused (401).
`option http-no-delay` sends each SSE event as it comes (without it HAProxy 2.6 adds ~16 ms to
a stream's first token, issue 18). One thread, as the gateway is one process: CPU per event is
then comparable.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

_SAFE_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]+$")


@dataclass(frozen=True)
class HaproxyTenant:
    """One tenant as HAProxy sees it: its key and its static share of the engine's slots."""

    name: str
    api_key: str
    maxconn: int


def haproxy_config(
    *,
    bind_host: str,
    bind_port: int,
    engine_host: str,
    engine_port: int,
    tenants: list[HaproxyTenant],
    timeout_s: float = 600.0,
) -> str:
    """The config text for `haproxy -f FILE -db`. ValueError when a tenant's key or name could
    not be written into the config as it is (white space, quotes), or a share is below 1."""
    lines = [
        "global",
        "    nbthread 1",
        "    maxconn 8192",
        "",
        "defaults",
        "    mode http",
        "    option http-no-delay",
        "    timeout connect 5s",
        f"    timeout client {int(timeout_s)}s",
        f"    timeout server {int(timeout_s)}s",
        f"    timeout queue {int(timeout_s)}s",
        "",
        "frontend bench",
        f"    bind {bind_host}:{bind_port}",
    ]
    for tenant in tenants:
        _check(tenant)
        lines.append(
            f'    acl key_{tenant.name} req.hdr(authorization) -m str "Bearer {tenant.api_key}"'
        )
    for tenant in tenants:
        lines.append(f"    use_backend tenant_{tenant.name} if key_{tenant.name}")
    lines += ["    default_backend unknown_key", ""]
    for tenant in tenants:
        lines += [
            f"backend tenant_{tenant.name}",
            f"    server engine {engine_host}:{engine_port} maxconn {tenant.maxconn}",
            "",
        ]
    lines += ["backend unknown_key", "    http-request deny deny_status 401", ""]
    return "\n".join(lines)


def _check(tenant: HaproxyTenant) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", tenant.name):
        raise ValueError(f"tenant name {tenant.name!r} is not a plain HAProxy identifier")
    if not _SAFE_KEY.fullmatch(tenant.api_key):
        raise ValueError(f"tenant {tenant.name}: its key has characters HAProxy would need quoted")
    if tenant.maxconn < 1:
        raise ValueError(f"tenant {tenant.name}: maxconn {tenant.maxconn} is below 1")


def tenants_of(keys: Mapping[str, str], shares: Mapping[str, int]) -> list[HaproxyTenant]:
    """The tenants, by name in `keys`' order, with their shares (at least one connection)."""
    return [HaproxyTenant(name, key, max(1, shares[name])) for name, key in keys.items()]


def find_haproxy() -> str | None:
    """The haproxy binary on PATH (or Debian's /usr/sbin), None when it is not installed."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
