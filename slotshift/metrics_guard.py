"""A bearer token on a service's Prometheus `/metrics` (each section's `metrics_token_file`):
the token read once at start and kept as its digest; a scrape without it gets 401."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from slotshift.config import ConfigError, read_secret_tokens
from slotshift.keys import key_digest


def metrics_token_digest(path: str, field: str) -> bytes:
    """The digest of the one token in `path` (read as every token file: blank lines and `#`
    comments skipped); ConfigError if the file cannot be read or holds none or several.
    Blocks: reads the file."""
    tokens = read_secret_tokens(path, field=field)
    if len(tokens) != 1:
        raise ConfigError(f"{field}: {path} holds {len(tokens)} tokens, one is needed")
    return key_digest(tokens[0])


METRICS_UNAUTHORIZED_BODY: Final = {"error": "unauthorized: /metrics needs its bearer token"}
"""The body of the 401 a scrape without the token gets (Prometheus shows its status)."""
METRICS_UNAUTHORIZED_HEADERS: Final = {"WWW-Authenticate": 'Bearer realm="metrics"'}


def metrics_unauthorized() -> web.Response:
    """The answer to a scrape without the token, from an aiohttp server."""
    return web.json_response(
        METRICS_UNAUTHORIZED_BODY, status=401, headers=METRICS_UNAUTHORIZED_HEADERS
    )
