"""Who may open a stream: the pure check of a peer's credentials against the control plane's.

A stream has a role (a gateway's Connect, an agent's StreamTelemetry). A peer presents a bearer
token (the call's `authorization` metadata) and, over mutual TLS, a client certificate whose
identities (its subject CN and DNS SANs) the transport has verified against the CA. The peer
passes when it passes every check its role configures:

- the token, when the role has tokens: it must be one of them. None, or a wrong one, is
  UNAUTHENTICATED; one of the other role's tokens is PERMISSION_DENIED (it is somebody, the
  wrong kind of somebody);
- the certificate, when the role has an allow-list: one of its identities must be listed. No
  certificate is UNAUTHENTICATED; one that the CA signed but that is not on the list (another
  role's, an unknown one) is PERMISSION_DENIED;
- the pools: a peer limited by its listed identities to some pools naming another is
  PERMISSION_DENIED. Tokens limit no pool.

A role that configures neither check is open (`RoleCredentials.open`): only when the operator
said so explicitly (slotshift/config/stream_auth.py). No I/O here: the gRPC layer
(controlplane/service/stream_guard.py) gathers what the peer presented and aborts the call.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slotshift.keys import BearerError, bearer_token, key_digest


class StreamRole(enum.Enum):
    """The two kinds of peer that open streams."""

    GATEWAY = "gateway"
    """An admission gateway: GatewayService.Connect."""
    AGENT = "agent"
    """A telemetry agent: TelemetryService.StreamTelemetry."""

    @property
    def other(self) -> StreamRole:
        """The role that is not this one."""
        return StreamRole.AGENT if self is StreamRole.GATEWAY else StreamRole.GATEWAY


class RejectionCode(enum.Enum):
    """Why a peer is refused, as the gRPC status it gets."""

    UNAUTHENTICATED = "UNAUTHENTICATED"
    """It proved no identity: no credentials, or wrong ones."""
    PERMISSION_DENIED = "PERMISSION_DENIED"
    """It proved an identity that may not do this: the other role's, or not this pool's."""


@dataclass(frozen=True)
class StreamRejection:
    """A refused peer: the status code and a reason that names no token."""

    code: RejectionCode
    reason: str


AllPools = None
"""`RoleCredentials.identities` value (and `StreamPeer.pools`) for "every pool"."""


@dataclass(frozen=True)
class RoleCredentials:
    """What one role's peers must present."""

    token_digests: tuple[bytes, ...] | None = None
    """key_digest of each accepted token; None: no token is asked for."""

    identities: Mapping[str, frozenset[str] | None] | None = None
    """Each allowed client-certificate identity -> the pools it may serve (AllPools: every
    one); None: the certificate's identity is not checked."""

    @property
    def open(self) -> bool:
        """Whether this role checks nothing (anyone may open its streams)."""
        return self.token_digests is None and self.identities is None

    @classmethod
    def of(
        cls,
        tokens: Iterable[str] | None = None,
        identities: Mapping[str, Iterable[str] | None] | None = None,
    ) -> RoleCredentials:
        """Credentials from tokens in clear (kept only as digests) and an allow-list
        (identity -> its pools, None for every pool). ValueError for an empty token or an
        empty token list (it would admit nobody, or, compared carelessly, anybody)."""
        digests: tuple[bytes, ...] | None = None
        if tokens is not None:
            listed = list(tokens)
            if not listed or any(not token for token in listed):
                raise ValueError("a role's tokens: at least one, none empty")
            digests = tuple(key_digest(token) for token in listed)
        allowed = (
            None
            if identities is None
            else {
                name: None if pools is None else frozenset(pools)
                for name, pools in identities.items()
            }
        )
        return cls(digests, allowed)


@dataclass(frozen=True)
class StreamCredentials:
    """What each role's peers must present; a role missing from `roles` is open."""

    roles: Mapping[StreamRole, RoleCredentials] = field(default_factory=dict)

    def of(self, role: StreamRole) -> RoleCredentials:
        """The credentials of `role` (open when none are configured)."""
        return self.roles.get(role, RoleCredentials())


@dataclass(frozen=True)
class StreamPeer:
    """A peer that proved it may open streams of `role`."""

    role: StreamRole
    pools: frozenset[str] | None
    """The pools it may serve; AllPools (None): every one."""
    described: str
    """How it proved it, for the log: "token", "certificate 'gw-1'", "open role"."""

    def refusal_for(self, pools: Iterable[str]) -> StreamRejection | None:
        """Why this peer may not serve every one of `pools` (PERMISSION_DENIED naming the first
        it may not), None when it may."""
        if self.pools is None:
            return None
        for pool in pools:
            if pool not in self.pools:
                return StreamRejection(
                    RejectionCode.PERMISSION_DENIED,
                    f"{self.described} may not serve pool {pool!r} as a {self.role.value}",
                )
        return None


def authenticate(
    credentials: StreamCredentials,
    role: StreamRole,
    authorization: str | None,
    certificate_names: Sequence[str],
) -> StreamPeer | StreamRejection:
    """The peer that presented `authorization` (the call's metadata value, None when absent)
    and a client certificate with `certificate_names` (its verified CN and DNS SANs; empty
    without one), asking for a stream of `role`: a StreamPeer when it passes every check the
    role configures (module docstring), else the rejection. UNAUTHENTICATED outranks
    PERMISSION_DENIED: a peer that proves nothing on one check is told that, whatever the
    other says. Tokens are compared in constant time, every accepted one each time."""
    own = credentials.of(role)
    if own.open:
        return StreamPeer(role, AllPools, "open role")
    rejections: list[StreamRejection] = []
    how: list[str] = []
    if own.token_digests is not None:
        token_refusal = _token_refusal(credentials, role, authorization)
        if token_refusal is None:
            how.append("token")
        else:
            rejections.append(token_refusal)
    pools: frozenset[str] | None = AllPools
    if own.identities is not None:
        allowed = _identity_pools(credentials, role, certificate_names)
        if isinstance(allowed, StreamRejection):
            rejections.append(allowed)
        else:
            pools, named = allowed
            how.append(f"certificate {named!r}")
    if rejections:
        rejections.sort(key=lambda r: r.code is not RejectionCode.UNAUTHENTICATED)
        return rejections[0]
    return StreamPeer(role, pools, " and ".join(how))


def check_stream_peer(
    credentials: StreamCredentials,
    role: StreamRole,
    authorization: str | None,
    certificate_names: Sequence[str],
    pools: Iterable[str],
) -> StreamPeer | StreamRejection:
    """`authenticate`, then whether the peer may serve every one of `pools`."""
    peer = authenticate(credentials, role, authorization, certificate_names)
    if isinstance(peer, StreamRejection):
        return peer
    refusal = peer.refusal_for(pools)
    return peer if refusal is None else refusal


def _token_refusal(
    credentials: StreamCredentials, role: StreamRole, authorization: str | None
) -> StreamRejection | None:
    try:
        presented = key_digest(bearer_token(authorization))
    except BearerError as exc:
        return StreamRejection(RejectionCode.UNAUTHENTICATED, f"no {role.value} token: {exc}")
    if _matches_any(presented, credentials.of(role).token_digests):
        return None
    if _matches_any(presented, credentials.of(role.other).token_digests):
        return StreamRejection(
            RejectionCode.PERMISSION_DENIED,
            f"a {role.other.value} token, not a {role.value} token",
        )
    return StreamRejection(RejectionCode.UNAUTHENTICATED, f"not a valid {role.value} token")


def _matches_any(presented: bytes, digests: tuple[bytes, ...] | None) -> bool:
    # Every digest is compared, whichever matches: the time says nothing of which one did.
    matches = [hmac.compare_digest(presented, digest) for digest in digests or ()]
    return any(matches)


def _identity_pools(
    credentials: StreamCredentials, role: StreamRole, names: Sequence[str]
) -> tuple[frozenset[str] | None, str] | StreamRejection:
    """The pools the listed identities among `names` may serve together, and the first of
    them (for the log); the rejection when none is listed."""
    if not names:
        return StreamRejection(
            RejectionCode.UNAUTHENTICATED, f"no client certificate (the {role.value}s need one)"
        )
    allowed = credentials.of(role).identities or {}
    listed = [name for name in names if name in allowed]
    if not listed:
        return StreamRejection(
            RejectionCode.PERMISSION_DENIED,
            f"client certificate {names[0]!r} is not on the {role.value}s' allow-list",
        )
    pools: set[str] = set()
    for name in listed:
        serves = allowed[name]
        if serves is None:
            return AllPools, name
        pools |= serves
    return frozenset(pools), listed[0]
