"""The streams' door: who may open a gateway's or an agent's stream, checked on the gRPC call
before anything is read from or sent to the peer.

The check itself is pure (controlplane/core/stream_identity.py); here the call's credentials are
gathered (the `authorization` metadata, the client certificate's verified identities from the
auth context), a refused call is aborted with UNAUTHENTICATED or PERMISSION_DENIED, counted, and
logged once per peer and reason (a peer that retries with backoff is not a line per attempt),
never with the token it presented.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import NoReturn

import grpc

from controlplane.core.stream_identity import (
    AllPools,
    RejectionCode,
    RoleCredentials,
    StreamCredentials,
    StreamPeer,
    StreamRejection,
    StreamRole,
    authenticate,
)
from slotshift.config import ConfigError, StreamAuthConfig, read_secret_tokens

logger = logging.getLogger(__name__)

RejectionObserver = Callable[[StreamRole, RejectionCode], None]
"""Called with the role and the code of every refused stream (the metrics)."""

_LOGGED_PEERS = 1024
"""Most (peer, reason) pairs remembered as logged: a flood of peers cannot grow the memory;
past it the oldest may be logged once more."""

_STATUS = {
    RejectionCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    RejectionCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}

# grpc.aio's auth context names (grpc_security_constants.h): the subject's CN and the DNS SANs.
_CERTIFICATE_NAME_KEYS = ("x509_common_name", "peer_dns")


def load_stream_credentials(auth: StreamAuthConfig) -> StreamCredentials:
    """Each role's credentials from `auth`: its token file read (every token in it) and its
    allow-list. ConfigError when a role has neither and `insecure_allow_unauthenticated` is
    unset (secure by default), or a token file cannot be read or holds no token. Blocks: reads
    the files (call it through asyncio.to_thread)."""
    roles: dict[StreamRole, RoleCredentials] = {}
    open_roles: list[str] = []
    for role, token_file, identities in (
        (StreamRole.GATEWAY, auth.gateway_token_file, auth.gateway_identities),
        (StreamRole.AGENT, auth.agent_token_file, auth.agent_identities),
    ):
        if token_file is None and identities is None:
            open_roles.append(role.value)
            continue
        tokens = (
            None
            if token_file is None
            else read_secret_tokens(
                token_file, field=f"controlplane.stream_auth.{role.value}_token_file"
            )
        )
        allowed = (
            None
            if identities is None
            else {i.name: None if i.pools == "all" else i.pools for i in identities}
        )
        roles[role] = RoleCredentials.of(tokens, allowed)
    if open_roles and not auth.insecure_allow_unauthenticated:
        raise ConfigError(
            f"controlplane.stream_auth: no credentials for the {' and '.join(open_roles)} "
            "streams: set a token file (or an allow-list of client certificates) per role, or "
            "insecure_allow_unauthenticated: true to let anyone who reaches the port open them"
        )
    if open_roles:
        logger.warning(
            "controlplane.stream_auth.insecure_allow_unauthenticated: the %s streams are open "
            "to anyone who reaches the gRPC port",
            " and ".join(open_roles),
        )
    gateway, agent = roles.get(StreamRole.GATEWAY), roles.get(StreamRole.AGENT)
    if gateway is not None and agent is not None:
        shared = set(gateway.token_digests or ()) & set(agent.token_digests or ())
        if shared:
            raise ConfigError(
                "controlplane.stream_auth: the gateway and agent token files share a token: "
                "give each role its own"
            )
    return StreamCredentials(roles)


class StreamGuard:
    """Checks the peer of each stream call. Refuses every call until `load` has given it the
    credentials (ControlPlane.start does, before it serves)."""

    def __init__(self, on_rejection: RejectionObserver | None = None) -> None:
        self._credentials: StreamCredentials | None = None
        self._on_rejection = on_rejection
        self._logged: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def load(self, credentials: StreamCredentials) -> None:
        """Check every call from now on against `credentials`."""
        self._credentials = credentials

    async def admit(
        self, context: grpc.aio.ServicerContext[object, object], role: StreamRole
    ) -> StreamPeer:
        """The call's peer, authenticated for `role`; else the call is aborted (abort raises)
        with UNAUTHENTICATED or PERMISSION_DENIED, before anything is sent."""
        if self._credentials is None:
            await self._refuse(
                context,
                role,
                StreamRejection(RejectionCode.UNAUTHENTICATED, "stream credentials not loaded"),
            )
        peer = authenticate(
            self._credentials,
            role,
            _authorization(context),
            _certificate_names(context),
        )
        if isinstance(peer, StreamRejection):
            await self._refuse(context, role, peer)
        return peer

    async def admit_pools(
        self,
        context: grpc.aio.ServicerContext[object, object],
        peer: StreamPeer,
        pools: Iterable[str],
    ) -> None:
        """Return if `peer` may serve every one of `pools`; else abort the call with
        PERMISSION_DENIED."""
        if peer.pools is AllPools:
            return
        refusal = peer.refusal_for(pools)
        if refusal is not None:
            await self._refuse(context, peer.role, refusal)

    async def _refuse(
        self,
        context: grpc.aio.ServicerContext[object, object],
        role: StreamRole,
        rejection: StreamRejection,
    ) -> NoReturn:
        if self._on_rejection is not None:
            self._on_rejection(role, rejection.code)
        self._log_once(_peer_host(context.peer()), role, rejection)
        await context.abort(_STATUS[rejection.code], f"{role.value} stream: {rejection.reason}")

    def _log_once(self, host: str, role: StreamRole, rejection: StreamRejection) -> None:
        key = (host, role.value, rejection.reason)
        if key in self._logged:
            self._logged.move_to_end(key)
            return
        self._logged[key] = None
        if len(self._logged) > _LOGGED_PEERS:
            self._logged.popitem(last=False)
        logger.warning(
            "refused %s stream from %s: %s (%s); further refusals of this peer for this "
            "reason are counted, not logged",
            "an agent" if role is StreamRole.AGENT else "a gateway",
            host,
            rejection.code.value,
            rejection.reason,
        )


def _authorization(context: grpc.aio.ServicerContext[object, object]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else None
    return None


def _certificate_names(context: grpc.aio.ServicerContext[object, object]) -> list[str]:
    """The client certificate's CN and DNS SANs, as the transport verified them; empty without
    a certificate (plaintext, or TLS without client certificates)."""
    auth = context.auth_context()
    names: list[str] = []
    for key in _CERTIFICATE_NAME_KEYS:
        for value in auth.get(key, ()):
            name = value.decode("utf-8", "replace")
            if name not in names:
                names.append(name)
    return names


def _peer_host(peer: str) -> str:
    """`ipv4:10.0.0.5:51234` -> `ipv4:10.0.0.5`: a reconnecting peer comes from a new port
    each time, and is the same peer."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer
