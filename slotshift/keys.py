"""API keys and tokens: the digests they are kept and compared in, and how a caller presents one.

Tenants' API keys are never kept or sent in the clear beyond the config that holds them: the
control plane keeps, stores and pushes their digests, and the gateways compare the digest of
each presented key with them. Those digests are keyed (`KeyDigester`): HMAC-SHA-256 under the
deployment's key-digest secret (`tenant_keys.key_digest_secret_file`, shared by the control
plane and the gateways), so that a digest read from the state store or off a stream cannot be
checked against guessed keys without the secret. A deployment may opt out
(`tenant_keys.unkeyed_key_digests`): digests are then plain SHA-256, the scheme of releases
before keyed digests.

Tokens compared only where they are configured (the admin token, the /metrics tokens) are
digested with `key_digest` (SHA-256): their digest never leaves the process, it only makes every
comparison one of equal lengths. Every comparison is constant-time (`hmac.compare_digest`).

A caller presents a key as `Authorization: Bearer KEY` (an HTTP header, or `authorization` gRPC
metadata).
"""

from __future__ import annotations

import hashlib
import hmac

UNKEYED_SCHEME = "sha256"
"""The scheme of unkeyed digests (the opt-out, and every digest stored before keyed digests)."""

KEYED_SCHEME_PREFIX = "hmac-sha256:"
"""A keyed scheme is this followed by the secret's id (`KeyDigester.secret_id`)."""

MIN_SECRET_BYTES = 32
"""The shortest key-digest secret accepted (256 bits: `openssl rand -hex 32` gives 64 chars)."""

KEY_ID_HEX_CHARS = 8
"""Length of a key id (`KeyDigester.key_id`): 32 bits, enough to tell a tenant's keys apart."""

_SECRET_ID_MESSAGE = b"slotshift key-digest secret id"
_KEY_ID_PREFIX = b"slotshift key id\x00"


class BearerError(ValueError):
    """An authorization value that carries no usable Bearer token; the message names no key."""


class MissingBearer(BearerError):
    """No authorization value, or a blank one."""


class MalformedBearer(BearerError):
    """An authorization value of another scheme, or a token empty or holding whitespace."""


def _utf8(text: str) -> bytes:
    # Lone surrogates are encoded as they are, so that every str has a digest.
    return text.encode("utf-8", "surrogatepass")


def key_digest(key: str) -> bytes:
    """SHA-256 of a token's UTF-8 bytes: the form of the tokens compared where they are
    configured (the admin token, /metrics tokens). Not for tenants' API keys: see KeyDigester."""
    return hashlib.sha256(_utf8(key)).digest()


class KeyDigester:
    """How tenants' API keys are digested in this deployment: HMAC-SHA-256 under the secret
    (`keyed`), or plain SHA-256 (`unkeyed`, the opt-out). Two digesters of one secret give the
    same digests; the secret never shows in a repr or a message.

    Every digest is 32 bytes; `scheme` names how it was made, so that what is stored with a
    digest says which digester can check it again.
    """

    __slots__ = ("_secret", "scheme", "secret_id")

    def __init__(self, secret: bytes | None) -> None:
        """secret: the key-digest secret (at least MIN_SECRET_BYTES), or None for unkeyed
        digests; ValueError when it is too short."""
        if secret is not None and len(secret) < MIN_SECRET_BYTES:
            raise ValueError(
                f"a key-digest secret needs at least {MIN_SECRET_BYTES} bytes, not {len(secret)}"
            )
        self._secret = secret
        self.secret_id = (
            ""
            if secret is None
            else hmac.new(secret, _SECRET_ID_MESSAGE, hashlib.sha256).hexdigest()[:8]
        )
        """A short, non-secret name of the secret (8 hex chars of an HMAC of a fixed message
        under it): tells a rotated secret from the one a digest was made under. Empty when
        unkeyed."""
        self.scheme = UNKEYED_SCHEME if secret is None else KEYED_SCHEME_PREFIX + self.secret_id
        """`sha256`, or `hmac-sha256:SECRET_ID`: what is stored with the digests made here."""

    @classmethod
    def keyed(cls, secret: str) -> KeyDigester:
        """Digests under `secret` (its UTF-8 bytes); ValueError when it is too short."""
        return cls(_utf8(secret))

    @classmethod
    def unkeyed(cls) -> KeyDigester:
        """Plain SHA-256 digests (the opt-out; the scheme stored before keyed digests)."""
        return cls(None)

    @property
    def is_keyed(self) -> bool:
        """Whether digests are made under a secret."""
        return self._secret is not None

    def digest(self, key: str) -> bytes:
        """The digest of an API key (32 bytes): HMAC-SHA-256(secret, UTF-8 of the key), or
        SHA-256 of it when unkeyed."""
        if self._secret is None:
            return hashlib.sha256(_utf8(key)).digest()
        # The one-shot form: no HMAC object per request.
        return hmac.digest(self._secret, _utf8(key), "sha256")

    def key_id(self, digest: bytes) -> str:
        """The short id of the key of `digest`, as the admin API shows and takes it
        (KEY_ID_HEX_CHARS hex chars of a second HMAC under the secret, of the digest): it
        names a key among a tenant's without helping anyone find the key or its digest. When
        unkeyed it is a SHA-256 of the digest, which could be checked against guessed keys, as
        the digest itself could."""
        message = _KEY_ID_PREFIX + digest
        if self._secret is None:
            mac = hashlib.sha256(message).hexdigest()
        else:
            mac = hmac.new(self._secret, message, hashlib.sha256).hexdigest()
        return mac[:KEY_ID_HEX_CHARS]

    def matches(self, key: str, digest: bytes) -> bool:
        """Whether `key`'s digest is `digest`, compared in constant time."""
        return hmac.compare_digest(self.digest(key), digest)

    def __repr__(self) -> str:
        return f"KeyDigester(scheme={self.scheme!r})"


def bearer_token(authorization: str | None) -> str:
    """The token of a `Bearer TOKEN` value (the scheme in any case, white space around either
    ignored); MissingBearer if the value is absent or blank, MalformedBearer if it is of another
    scheme or the token is empty or holds white space."""
    if authorization is None or not authorization.strip():
        raise MissingBearer("no authorization given")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    # Stripped, the token holds white space exactly when it splits in two (split's white space
    # is isspace's); one C call, where a test of each character cost every request microseconds.
    if scheme.lower() != "bearer" or not token or len(token.split(None, 1)) != 1:
        raise MalformedBearer("authorization is not of the form 'Bearer TOKEN'")
    return token


def bearer_matches(authorization: str | None, digest: bytes) -> bool:
    """Whether an authorization value carries `Bearer TOKEN` with the token whose key_digest is
    `digest` (compared in constant time); False for a missing or malformed value."""
    try:
        presented = key_digest(bearer_token(authorization))
    except BearerError:
        return False
    return hmac.compare_digest(presented, digest)
