"""Overrides of single fields, by dotted path: what the entrypoints make of their flags and
environment variables (`--set gateway.port=8081`) before the services see the config."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from slotshift.config.base import ConfigError
from slotshift.config.document import SlotshiftConfig
from slotshift.config.loading import parse_config
from slotshift.config.secrets import revealed


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`SECTION.FIELD=VALUE` pairs (`--set` flags) as overrides for `apply_overrides`, each
    value parsed as YAML (`8081` an int, `null` None); ConfigError for a pair without `=` or a
    path; a path given twice keeps its last value."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected SECTION.FIELD=VALUE")
        overrides[key.strip()] = yaml.safe_load(raw)
    return overrides


def apply_overrides(config: SlotshiftConfig, overrides: Mapping[str, Any]) -> SlotshiftConfig:
    """Return a copy with dotted-path overrides applied and re-validated.

    A path names fields by name and list items by index: `gateway.port` = 8081,
    `pools.0.decision_period_s` = 1.0.
    """
    data = revealed(config.model_dump(mode="python"))
    for dotted, value in overrides.items():
        node: Any = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = _child(node, part, dotted)
        _child(node, leaf, dotted)
        node[int(leaf) if isinstance(node, list) else leaf] = value
    return parse_config(data, source="overrides")


def _child(node: Any, part: str, dotted: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise ConfigError(f"override {dotted}: no field or item {part!r}")
