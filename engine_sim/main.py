"""Entrypoint of the vLLM emulator service (`slotshift engine-sim`)."""

from __future__ import annotations

import asyncio
import logging

from engine_sim.server import EngineSim
from slotshift.config import SlotshiftConfig
from slotshift.tracing import tracing_from_environment

logger = logging.getLogger(__name__)

SERVICE_NAME = "slotshift-engine-sim"
"""The service name its spans carry unless OTEL_SERVICE_NAME says otherwise."""


async def run(config: SlotshiftConfig, stop: asyncio.Event) -> None:
    """Serve the emulator until `stop` is set, then drain (shutdown_grace_s) and stop."""
    tracing = tracing_from_environment(SERVICE_NAME)
    try:
        await _serve(config, stop, EngineSim(config.engine_sim, tracer_provider=tracing.provider))
    finally:
        await tracing.shutdown()


async def _serve(config: SlotshiftConfig, stop: asyncio.Event, sim: EngineSim) -> None:
    section = config.engine_sim
    await sim.start()
    try:
        logger.info(
            "engine_sim ready on %s (profile %s, model %s, max_num_seqs %d, kv_cache_blocks %d)",
            sim.url,
            section.profile,
            sim.profile.model_name,
            sim.profile.max_num_seqs,
            sim.profile.kv_cache_blocks,
        )
        await stop.wait()
        logger.info(
            "engine_sim stopping: draining %d request(s)", sim.num_running + sim.num_waiting
        )
    finally:
        await sim.stop()
