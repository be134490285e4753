"""Reading the configuration: the YAML file, its validation, and what loading adds to it (the
files' paths made absolute, the tenants' API-key files and the key-digest secret read in)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr, ValidationError

from slotshift.config.base import ConfigError
from slotshift.config.document import SlotshiftConfig
from slotshift.config.paths import resolve_path, with_resolved_paths
from slotshift.config.secrets import read_secret_text, revealed
from slotshift.config.state_store import DEFAULT_SQLITE_NAME
from slotshift.keys import MIN_SECRET_BYTES


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
    the file's folder, slotshift/config/paths.py), the tenants' api_keys_file and the
    key-digest secret read in. ConfigError also when the file sets no key-digest secret and does
    not opt out (tenant_keys.unkeyed_key_digests): a deployment's keys are digested keyed."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    config = with_resolved_paths(parse_config(data, source=str(path)), path.parent)
    config = _with_digest_secret(_with_key_files(config, source=str(path)), source=str(path))
    return _with_state_beside(config, path)


def _with_digest_secret(config: SlotshiftConfig, *, source: str) -> SlotshiftConfig:
    """The key-digest secret read in from its file (its first line, stripped); ConfigError
    when the file is unset without the opt-out, unreadable, or holds too short a secret."""
    settings = config.tenant_keys
    path = settings.key_digest_secret_file
    if path is None:
        if settings.unkeyed_key_digests or settings.key_digest_secret is not None:
            return config
        raise ConfigError(
            f"{source}: tenant_keys.key_digest_secret_file: unset. The tenants' API keys are "
            "kept and pushed as HMAC-SHA-256 digests under a deployment secret: write one to a "
            "file (`openssl rand -hex 32 > key-digest-secret`), shared by the control plane "
            "and every gateway, and point tenant_keys.key_digest_secret_file at it; or set "
            "tenant_keys.unkeyed_key_digests: true to keep unkeyed SHA-256 digests (not "
            'recommended: docs/operations.md, "API keys")'
        )
    field = f"{source}: tenant_keys.key_digest_secret_file"
    lines = read_secret_text(path, field=field).splitlines()
    secret = lines[0].strip() if lines else ""
    if len(secret.encode("utf-8", "surrogatepass")) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{field}: {path} holds no secret of at least {MIN_SECRET_BYTES} bytes on its first "
            "line (`openssl rand -hex 32` makes one)"
        )
    keys = settings.model_copy(update={"key_digest_secret": SecretStr(secret)})
    return config.model_copy(update={"tenant_keys": keys})


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
    # A replica group's members carry no tenants in the dump: their keys are read into the
    # group's tenants, which validation divides among the members again.
    holders = [("pool", pool) for pool in data["pools"]]
    holders += [("replica group", group) for group in data["replica_groups"]]
    for kind, holder in holders:
        for tenant in holder.get("tenants", ()):
            if tenant["api_keys_file"] is None:
                continue
            text = read_secret_text(
                tenant["api_keys_file"],
                field=f"{source}: tenant {tenant['name']!r} of {kind} {holder['name']!r}: "
                "api_keys_file",
            )
            tenant["api_keys"] += _keys_in(text)
    return parse_config(data, source=source)


def _keys_in(text: str) -> list[str]:
    """The keys of an api_keys_file: one per line, blank lines and `#` comments skipped."""
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]
