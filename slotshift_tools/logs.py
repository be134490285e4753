"""Logging set-up for the entrypoints: one line per record, service name first."""

from __future__ import annotations

import logging
import sys


def configure_logging(service: str, level: str) -> None:
    """Log to stderr as `time level service logger: message`; called once by the CLI."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            fmt=f"%(asctime)s %(levelname)-7s {service} %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would drown the demo; errors still come through.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
