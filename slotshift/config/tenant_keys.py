"""How the tenants' API keys are digested: the deployment's key-digest secret.

One section for the control plane and every gateway (both digest keys, and their digests must
agree): the control plane digests the keys of the config and of the admin API, stores and pushes
the digests; a gateway digests each presented key and compares. docs/operations.md ("API keys")
says how to make, share and rotate the secret.
"""

from __future__ import annotations

from pydantic import SecretStr, model_validator

from slotshift.config.base import ConfigError, ConfigModel
from slotshift.config.secrets import reveal
from slotshift.keys import KeyDigester


class TenantKeysConfig(ConfigModel):
    """The key-digest secret (slotshift/keys.py, KeyDigester)."""

    key_digest_secret_file: str | None = None
    """A file whose first line is the secret (at least 32 bytes; `openssl rand -hex 32`) of the
    HMAC-SHA-256 the tenants' API keys are digested with, such as a mounted Kubernetes Secret;
    the same file for the control plane and every gateway. Relative to the config file's
    folder; read when the config is loaded. A config file must set it unless
    unkeyed_key_digests is true (loading refuses it otherwise)."""

    key_digest_secret: SecretStr | None = None
    """The secret itself: loading fills it in from key_digest_secret_file (a config file sets
    the file, not this). A config built in code may set it directly; one that sets neither
    digests unkeyed, as unkeyed_key_digests does (its services log that at start)."""

    unkeyed_key_digests: bool = False
    """Opt out of keyed digests: the keys' digests are plain SHA-256 (the scheme before keyed
    digests), which anyone holding one (from the state store, from a stream) can check against
    guessed keys. Only to run a state store of that scheme on until its key changes are made
    again (docs/operations.md); not with a secret."""

    drop_stale_key_changes: bool = False
    """At start, drop (logged, and marked dropped in the state store) the stored admin changes
    whose key digests are of another scheme than this config's (made under a rotated secret, or
    unkeyed before keyed digests), instead of refusing to start: their keys stop working until
    they are added again through the admin API. Set it for one start, then unset it."""

    @model_validator(mode="after")
    def _one_scheme(self) -> TenantKeysConfig:
        keyed = self.key_digest_secret_file is not None or self.key_digest_secret is not None
        if keyed and self.unkeyed_key_digests:
            raise ValueError(
                "unkeyed_key_digests: true opts out of keyed digests; unset it, or unset "
                "key_digest_secret_file"
            )
        return self


def key_digester(settings: TenantKeysConfig) -> KeyDigester:
    """The digester of `settings`: keyed under key_digest_secret, else unkeyed (the opt-out, or
    a config built in code with no secret). ConfigError when the secret is too short."""
    if settings.key_digest_secret is None:
        return KeyDigester.unkeyed()
    try:
        return KeyDigester.keyed(reveal(settings.key_digest_secret))
    except ValueError as exc:
        raise ConfigError(f"tenant_keys.key_digest_secret: {exc}") from None
