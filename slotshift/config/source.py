"""Where a running service's config comes from, so that it can be read again: the file, and
the overrides its entrypoint made of flags and environment variables (`--set`).

A reload (the control plane's, controlplane/config_reload.py) reads the file again through the
same source, so that the overrides apply again and a field set by `--set` does not look changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slotshift.config.document import SlotshiftConfig
from slotshift.config.loading import load_config
from slotshift.config.overrides import apply_overrides


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """A config file and the dotted overrides (parse_overrides) applied on top of it."""

    path: Path
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> SlotshiftConfig:
        """Read and validate the file, then apply the overrides; ConfigError naming the problem
        (unreadable, not YAML, a bad field, an unreadable key file or secret). Blocking I/O."""
        config = load_config(self.path)
        return apply_overrides(config, self.overrides) if self.overrides else config

    def fingerprint(self, config: SlotshiftConfig) -> str:
        """A SHA-256 (hex) of the content of the file and of the files `config` (as loaded from
        it) reads in at load: the tenants' api_keys_file and the key-digest secret. Content, not
        modification times: a Kubernetes ConfigMap or Secret mount changes by swapping a
        symlink, which leaves the times of what it points to as they were. An unreadable file
        counts as its error, so that a file that comes back is a change. Blocking I/O."""
        digest = hashlib.sha256()
        paths = [str(self.path)]
        paths += sorted(
            {t.api_keys_file for pool in config.pools for t in pool.tenants if t.api_keys_file}
        )
        if config.tenant_keys.key_digest_secret_file is not None:
            paths.append(config.tenant_keys.key_digest_secret_file)
        for path in paths:
            digest.update(path.encode("utf-8", "surrogatepass") + b"\0")
            try:
                content = Path(path).read_bytes()
            except OSError as exc:
                content = f"unreadable: {exc.strerror}".encode()
            digest.update(hashlib.sha256(content).digest())
        return digest.hexdigest()
