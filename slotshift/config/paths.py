"""File paths in the configuration: the one rule that resolves them.

Every field whose name ends in `_file` names a file (TLS certificates and keys, API-key files,
the admin token). A relative path there is relative to the config file's folder; loading makes
each absolute, so that it names the same file whatever the services' working directory, and a
dump of the config names it wherever that dump is read again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

FILE_FIELD_SUFFIX = "_file"
"""The ending of the name of every field that holds a file's path."""

_Model = TypeVar("_Model", bound=BaseModel)


def resolve_path(path: str, base: Path) -> str:
    """`path` as an absolute path: relative to `base` (the config file's folder) unless it is
    absolute already. Nothing is read; the file need not exist."""
    return str((base / path).absolute())


def with_resolved_paths(model: _Model, base: Path) -> _Model:
    """A copy of `model` (the whole config or any section) with every `_file` field, at any
    depth, resolved by `resolve_path`; unset fields stay unset, and `model` itself is returned
    when it holds no path. Only paths change, so the copy is not validated again."""
    update: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if name.endswith(FILE_FIELD_SUFFIX) and isinstance(value, str):
            update[name] = resolve_path(value, base)
        elif isinstance(value, BaseModel):
            resolved = with_resolved_paths(value, base)
            if resolved is not value:
                update[name] = resolved
        elif isinstance(value, list):
            items = [
                with_resolved_paths(item, base) if isinstance(item, BaseModel) else item
                for item in value
            ]
            if any(new is not old for new, old in zip(items, value, strict=True)):
                update[name] = items
    return model.model_copy(update=update) if update else model
