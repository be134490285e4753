"""What every section of the configuration shares: the model base, the error, the field types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

PositiveSeconds = Annotated[float, Field(gt=0)]
Port = Annotated[int, Field(ge=0, le=65535)]
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
"""A pool's or a tenant's name: what allocations, metrics, traces and API messages carry."""


class ConfigError(ValueError):
    """A configuration file that cannot be read or does not validate."""


class ConfigModel(BaseModel):
    """A section of the configuration: frozen, no unknown fields, each field documented by the
    docstring under it (pydantic reads them into the schema)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True
    )
