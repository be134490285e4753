"""Reading the configuration: the YAML file, its validation, and what loading adds to it (the
files' paths made absolute, the tenants' API-key files read in)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from slotshift.config.base import ConfigError
from slotshift.config.document import SlotshiftConfig
from slotshift.config.paths import resolve_path, with_resolved_paths
from slotshift.config.secrets import read_secret_text, revealed
from slotshift.config.state_store import DEFAULT_SQLITE_NAME


def validation_problems(exc: ValidationError) -> str:
    """Each bad field of a document, by its dotted path, with pydantic's message."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
    )


def parse_config(data: Mapping[str, Any], *, source: str = "<config>") -> SlotshiftConfig:
    """Validate a parsed document; ConfigError names each bad field."""
    try:
        return SlotshiftConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {validation_problems(exc)}") from exc


def load_config(path: Path) -> SlotshiftConfig:
    """Read and validate a YAML configuration file: its `_file` paths made absolute (relative to
    the file's folder, slotshift/config/paths.py) and the tenants' api_keys_file read in."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    config = with_resolved_paths(parse_config(data, source=str(path)), path.parent)
    return _with_state_beside(_with_key_files(config, source=str(path)), path)


def _with_state_beside(config: SlotshiftConfig, path: Path) -> SlotshiftConfig:
    """The SQLite state store beside the config file where its file is unset: a config loaded
    from a file keeps its state (a config built in code, with no file, keeps it in memory)."""
    store = config.controlplane.state_store
    if store.kind != "sqlite" or store.sqlite_file is not None:
        return config
    beside = resolve_path(DEFAULT_SQLITE_NAME, path.parent)
    controlplane = config.controlplane.model_copy(
        update={"state_store": store.model_copy(update={"sqlite_file": beside})}
    )
    return config.model_copy(update={"controlplane": controlplane})


def _with_key_files(config: SlotshiftConfig, *, source: str) -> SlotshiftConfig:
    """Add each tenant's api_keys_file keys (its path resolved already) to its api_keys."""
    if not any(t.api_keys_file for pool in config.pools for t in pool.tenants):
        return config
    data = revealed(config.model_dump(mode="python"))
    for pool in data["pools"]:
        for tenant in pool["tenants"]:
            if tenant["api_keys_file"] is None:
                continue
            text = read_secret_text(
                tenant["api_keys_file"],
                field=f"{source}: tenant {tenant['name']!r} of pool {pool['name']!r}: "
                "api_keys_file",
            )
            tenant["api_keys"] += _keys_in(text)
    return parse_config(data, source=source)


def _keys_in(text: str) -> list[str]:
    """The keys of an api_keys_file: one per line, blank lines and `#` comments skipped."""
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]
