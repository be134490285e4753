"""Secrets in the configuration, and the one way to reveal them.

API keys and tokens are held as `SecretStr`, which shows as `**********` in reprs, dumps and
logs. A secret's value comes out through `reveal` (or `revealed`, for a whole dump), a secret's
file through `read_secret_file` / `read_secret_text` / `read_secret_tokens` (API-key files, the
admin token, the engine's API key, TLS keys and certificates): only where the value must be used (hashing a key, sending a token, writing a
child process's config), never to log it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import SecretStr

from slotshift.config.base import ConfigError


def reveal(secret: SecretStr) -> str:
    """The secret's value, in clear."""
    return secret.get_secret_value()


def revealed(data: Any) -> Any:
    """A copy of `data` (a config dump, `model_dump(mode="python")`) with every SecretStr, at
    any depth of dicts and lists, replaced by its value: a dump that validates again into the
    same config. Other values are shared, not copied."""
    if isinstance(data, SecretStr):
        return reveal(data)
    if isinstance(data, dict):
        return {key: revealed(value) for key, value in data.items()}
    if isinstance(data, list):
        return [revealed(value) for value in data]
    return data


def read_secret_file(path: str, *, field: str) -> bytes:
    """The bytes of a secret's file (a path resolved by slotshift/config/paths.py). Blocks:
    services call it at start-up (through `asyncio.to_thread` once a loop runs). ConfigError,
    `{field}: cannot read {path}: ...`, when the file cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc}") from exc


def read_secret_text(path: str, *, field: str) -> str:
    """The text (UTF-8) of a secret's file; as `read_secret_file`, and ConfigError also when it
    is not UTF-8."""
    data = read_secret_file(path, field=field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc}") from exc


def read_secret_tokens(path: str, *, field: str) -> list[str]:
    """The tokens of a secret's file, one per line (a mounted Kubernetes Secret ends in a
    newline or not): each line stripped, blank lines and lines starting with `#` skipped. As
    `read_secret_text`, and ConfigError, `{field}: {path} holds no token`, when none is left
    (an empty key would authenticate nobody, or everybody)."""
    text = read_secret_text(path, field=field)
    stripped = (line.strip() for line in text.splitlines())
    tokens = [line for line in stripped if line and not line.startswith("#")]
    if not tokens:
        raise ConfigError(f"{field}: {path} holds no token")
    return tokens
