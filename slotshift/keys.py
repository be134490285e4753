"""API keys and tokens: the digest they are kept and compared in, and how a caller presents one.

A key is never kept or sent in the clear beyond the config that holds it: the control plane keeps
and pushes SHA-256 digests, the gateways and the admin API compare digests (of one length, so that
the comparison's time says nothing of a key's length). A caller presents a key as
`Authorization: Bearer KEY` (an HTTP header, or `authorization` gRPC metadata).
"""

from __future__ import annotations

import hashlib
import hmac


class BearerError(ValueError):
    """An authorization value that carries no usable Bearer token; the message names no key."""


class MissingBearer(BearerError):
    """No authorization value, or a blank one."""


class MalformedBearer(BearerError):
    """An authorization value of another scheme, or a token empty or holding whitespace."""


def key_digest(key: str) -> bytes:
    """SHA-256 of a key's (or token's) UTF-8 bytes: the form keys are kept, pushed and compared
    in. Lone surrogates are encoded as they are, so every str has a digest."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def bearer_token(authorization: str | None) -> str:
    """The token of a `Bearer TOKEN` value (the scheme in any case, white space around either
    ignored); MissingBearer if the value is absent or blank, MalformedBearer if it is of another
    scheme or the token is empty or holds white space."""
    if authorization is None or not authorization.strip():
        raise MissingBearer("no authorization given")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
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
