"""`slotshift controlplane`: run the control plane until told to stop."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

from controlplane.server import ControlPlane
from slotshift.config import ConfigSource, SlotshiftConfig
from slotshift.tracing import tracing_from_environment

GC_THRESHOLD = (10_000, 20, 20)
"""The collector's thresholds (CPython's default is (700, 10, 10)). The control plane holds every
gateway's figures, a few objects per tenant per gateway, and makes and drops as many with each
full report: at 10,000 tenants the default's collections took about a quarter of a decision's
time (194 -> 151 ms per decision in process with these)."""

DEPOSED_EXIT_STATUS = 3
"""The status `slotshift controlplane` exits with when its replica lost the leader lease: its
pools' state is a leader's, so it comes back (its supervisor restarts it) as a fresh follower."""

logger = logging.getLogger(__name__)

SERVICE_NAME = "slotshift-controlplane"
"""The service name its spans carry unless OTEL_SERVICE_NAME says otherwise."""


async def run(
    config: SlotshiftConfig, stop: asyncio.Event, *, source: ConfigSource | None = None
) -> None:
    """Run the control plane until `stop` is set; SystemExit(DEPOSED_EXIT_STATUS) once stopped
    if its replica lost the leader lease first. With the `source` `config` was read from,
    SIGHUP reloads it (controlplane/config_reload.py) while it runs. ConfigError, before it
    serves, when the config cannot be run (no stream credentials, a token file unreadable:
    ControlPlane.start); the CLI says it in one line and exits with status 2."""
    gc.set_threshold(*GC_THRESHOLD)
    tracing = tracing_from_environment(SERVICE_NAME)
    try:
        control_plane = ControlPlane(config, tracer_provider=tracing.provider, source=source)
        await control_plane.start()
        loop = asyncio.get_running_loop()
        if source is not None:
            loop.add_signal_handler(signal.SIGHUP, control_plane.request_reload)
        try:
            await _first_of(stop, control_plane.deposed)
        finally:
            if source is not None:
                loop.remove_signal_handler(signal.SIGHUP)
            await control_plane.stop()
    finally:
        await tracing.shutdown()
    if control_plane.deposed.is_set() and not stop.is_set():
        logger.error("exiting: this replica lost the leader lease; restart it as a follower")
        raise SystemExit(DEPOSED_EXIT_STATUS)


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(e.wait(), name="controlplane/wait") for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
