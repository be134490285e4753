"""Who is calling: the tenant behind an `Authorization: Bearer KEY` header.

The tenant comes from the key alone, never from anything else the client sends. Keys are compared
in constant time: the presented key and every configured key are digested to the same length (by
the deployment's KeyDigester, slotshift/keys.py: HMAC-SHA-256 under its key-digest secret, the
digests the control plane pushes) and every configured key is compared, whichever matches, so
that timing reveals neither a key's length nor which key matched. Keys never appear in messages
or logs.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from slotshift.config import PoolConfig, reveal
from slotshift.keys import KeyDigester, MalformedBearer, MissingBearer, bearer_token


class AuthenticationError(Exception):
    """The request carries no usable API key; the message is safe to show to the client."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code
        """Machine-readable cause: missing_api_key, malformed_authorization or invalid_api_key."""


class Authenticator:
    """Maps API keys to tenants, digested by `digester`."""

    def __init__(self, keys: Iterable[tuple[str, str]], *, digester: KeyDigester) -> None:
        """keys: (api key, tenant) pairs. A key given to two tenants is a configuration error."""
        self.digester = digester
        """How presented keys are digested: as the control plane digested those it pushes."""
        pairs = []
        for key, tenant in keys:
            if not key:
                raise ValueError(f"tenant {tenant}: an API key must not be empty")
            pairs.append((digester.digest(key), tenant))
        self._entries = _entries(pairs)

    def replace_digests(self, digests: Iterable[tuple[bytes, str]]) -> None:
        """Authenticate exactly these (digest of an API key by `digester`, tenant) pairs from
        now on (the tenants the control plane pushes); ValueError, and no change, if two tenants
        share one."""
        self._entries = _entries(digests)

    @property
    def tenants(self) -> set[str]:
        """The tenants some key identifies."""
        return {tenant for _, tenant in self._entries}

    @classmethod
    def for_pool(cls, pool: PoolConfig, *, digester: KeyDigester) -> Authenticator:
        """The keys of every tenant of `pool`."""
        return cls(
            ((reveal(key), tenant.name) for tenant in pool.tenants for key in tenant.api_keys),
            digester=digester,
        )

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant named by an Authorization header's value; AuthenticationError otherwise."""
        presented = self.digester.digest(_presented_key(authorization))
        matched: str | None = None
        for digest, tenant in self._entries:
            # Compare against every key, even after a match, so that the time taken does not
            # depend on which key matched.
            if hmac.compare_digest(digest, presented):
                matched = tenant
        if matched is None:
            raise AuthenticationError("Incorrect API key provided.", code="invalid_api_key")
        return matched


def _presented_key(authorization: str | None) -> str:
    """The key of an Authorization header's value, or the AuthenticationError to answer with."""
    try:
        return bearer_token(authorization)
    except MissingBearer:
        raise AuthenticationError(
            "Missing API key: send it as 'Authorization: Bearer KEY'.", code="missing_api_key"
        ) from None
    except MalformedBearer:
        raise AuthenticationError(
            "Malformed Authorization header: expected 'Bearer KEY'.",
            code="malformed_authorization",
        ) from None


def _entries(digests: Iterable[tuple[bytes, str]]) -> tuple[tuple[bytes, str], ...]:
    owners: dict[bytes, str] = {}
    for digest, tenant in digests:
        if owners.get(digest, tenant) != tenant:
            raise ValueError(f"tenants {owners[digest]} and {tenant} share an API key")
        owners[digest] = tenant
    return tuple(owners.items())
