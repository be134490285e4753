"""The benchmark's grid: (tenants, gateways) points, each with its report interval and budget."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_GRID = "10x2,30x4,100x10,1000x10,1000x100,10000x10"
"""The points of issue 13: from the demo's size to a fleet's."""

_POINT = re.compile(r"^(\d+)x(\d+)(?:@(\d+(?:\.\d+)?))?$")


class GridError(ValueError):
    """A grid on the command line that cannot be read."""


@dataclass(frozen=True)
class GridPoint:
    """One point of the grid."""

    tenants: int
    gateways: int
    report_interval_s: float | None = None
    """The gateways' report interval at this point; None: the command's --interval-s."""

    @property
    def label(self) -> str:
        """`TxG`, as the grid is written (the interval is not part of it)."""
        return f"{self.tenants}x{self.gateways}"


def parse_grid(text: str) -> list[GridPoint]:
    """Read `TxG[@INTERVAL_S],...` (e.g. `10x2,100x10,1000x10@1`); GridError when a point is
    malformed or names no tenant, no gateway, or an interval that is not positive."""
    points = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        match = _POINT.match(item)
        if match is None:
            raise GridError(f"grid point {item!r}: expected TENANTSxGATEWAYS[@INTERVAL_S]")
        tenants, gateways = int(match.group(1)), int(match.group(2))
        interval = float(match.group(3)) if match.group(3) is not None else None
        if tenants < 1 or gateways < 1:
            raise GridError(f"grid point {item!r}: needs at least one tenant and one gateway")
        if interval is not None and interval <= 0:
            raise GridError(f"grid point {item!r}: the report interval must be positive")
        points.append(GridPoint(tenants, gateways, interval))
    if not points:
        raise GridError("the grid names no point")
    return points


def budget_for(tenants: int, *, per_tenant: int, minimum: int) -> int:
    """The pool's budget at a point: `per_tenant` slots a tenant, at least `minimum` (the demo
    pool's 96), so that every tenant's default floor of one slot fits."""
    return max(minimum, per_tenant * tenants, tenants)
