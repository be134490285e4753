"""A one-report mailbox between the sampler and the stream: the newest report wins.

While the control plane is unreachable the sampler keeps sampling; each new report replaces the
unsent one, so memory stays bounded and the first report sent after a reconnection is the
freshest one, not a backlog of stale figures.
"""

from __future__ import annotations

import asyncio

from slotshift.v1 import telemetry_pb2


class LatestReport:
    """Holds at most one unsent report; one consumer waits for it."""

    def __init__(self) -> None:
        self._report: telemetry_pb2.TelemetryReport | None = None
        self._wakeup = asyncio.Event()

    def put(self, report: telemetry_pb2.TelemetryReport) -> bool:
        """Offer a report; True if it replaced one that was never sent."""
        superseded = self._report is not None
        self._report = report
        self._wakeup.set()
        return superseded

    def put_back(self, report: telemetry_pb2.TelemetryReport) -> None:
        """Return a report taken but not sent, unless a newer one has arrived since."""
        if self._report is None:
            self._report = report
            self._wakeup.set()

    def interrupt(self) -> None:
        """Wake the waiting consumer without a report (its stream has ended)."""
        self._wakeup.set()

    async def take(self) -> telemetry_pb2.TelemetryReport | None:
        """The unsent report once there is one; None if interrupt() woke the consumer first."""
        await self._wakeup.wait()
        self._wakeup.clear()
        report, self._report = self._report, None
        return report
