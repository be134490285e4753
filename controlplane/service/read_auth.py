"""Bearer tokens on the control plane's gRPC calls: the admin token on AdminService's changes,
and, optionally, a token on the read-only calls (`controlplane.query_token_file`).

A caller presents a token as `authorization: Bearer TOKEN` call metadata. The tokens a call
accepts are kept only as digests (`key_digest`, slotshift/keys.py) and each presented token is
compared with every one of them in constant time (`bearer_matches`); no token is logged or put
in a status message.

The read-only calls are every method of AllocationService and AdminService.GetPoolConfig
(`READ_METHODS`). With query tokens configured, `ReadGate` (a server interceptor) refuses them
with UNAUTHENTICATED unless the call presents one of those tokens or the admin token (an admin
may read), before the servicer sees the call; a new AllocationService method is covered without
a change here. gRPC health (the probes) and reflection (`grpcurl list`, `describe`) stay open:
they tell the services' names and their health, nothing of the pools. Without query tokens the
read-only calls answer anyone, as they always have.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc

from controlplane.leader_gate import refusing
from slotshift.config import read_secret_tokens
from slotshift.keys import bearer_matches, key_digest
from slotshift.v1 import admin_pb2, query_pb2

READ_METHODS = frozenset(
    {
        f"/{service.full_name}/{method.name}"
        for service in (query_pb2.DESCRIPTOR.services_by_name["AllocationService"],)
        for method in service.methods
    }
    | {f"/{admin_pb2.DESCRIPTOR.services_by_name['AdminService'].full_name}/GetPoolConfig"}
)
"""The full method names (`/package.Service/Method`) of the read-only calls."""

READ_REFUSAL = (
    "authorization: this control plane's queries need a token: send "
    "'authorization: Bearer TOKEN' metadata with a token of controlplane.query_token_file "
    "or the admin token"
)
"""The UNAUTHENTICATED status's message of a read-only call without an accepted token."""

Metadata = Iterable[tuple[str, str | bytes]]
"""A call's metadata as grpc gives it: (key, value) pairs, keys in lower case."""


def authorization_of(metadata: Metadata | None) -> str | None:
    """The call's `authorization` value (the last one, when it sends several); None when it
    sends none or a binary one."""
    found: str | None = None
    for key, value in metadata or ():
        if key.lower() == "authorization":
            found = value if isinstance(value, str) else None
    return found


class BearerTokens:
    """The tokens a call may present, kept as digests. Several accepted at once: a rotation
    (old and new), or the query tokens with the admin token."""

    __slots__ = ("_digests",)

    def __init__(self, tokens: Iterable[str]) -> None:
        """ValueError when `tokens` is empty or holds an empty token (which would admit
        nobody, or, compared carelessly, anybody)."""
        listed = list(tokens)
        if not listed or any(not token for token in listed):
            raise ValueError("accepted tokens: at least one, none empty")
        self._digests = tuple(key_digest(token) for token in listed)

    def admits(self, metadata: Metadata | None) -> bool:
        """Whether the call's metadata carries `authorization: Bearer TOKEN` with one of these
        tokens. Every digest is compared (in constant time), whichever matches: how long it
        takes tells nothing of which token, or how much of one, was right."""
        authorization = authorization_of(metadata)
        matches = [bearer_matches(authorization, digest) for digest in self._digests]
        return any(matches)

    def __repr__(self) -> str:
        return f"BearerTokens({len(self._digests)} token(s))"


def load_read_tokens(query_token_file: str | None, admin_token: str | None) -> BearerTokens | None:
    """The tokens the read-only calls accept: every token of `query_token_file` (one per line,
    as `read_secret_tokens` reads them) and the admin token; None (the calls are open) when no
    query token file is set. ConfigError when the file cannot be read or holds no token.
    Blocks: reads the file (call it through asyncio.to_thread)."""
    if query_token_file is None:
        return None
    tokens = read_secret_tokens(query_token_file, field="controlplane.query_token_file")
    return BearerTokens([*tokens, *([] if admin_token is None else [admin_token])])


class ReadGate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # not generic at run time
    """Refuses the read-only calls (READ_METHODS) that present none of `tokens`, with
    UNAUTHENTICATED; with `tokens` None it lets every call through. Other calls pass untouched
    (their services check their own credentials, or need none)."""

    def __init__(self, tokens: BearerTokens | None) -> None:
        self._tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or self._tokens is None or method not in READ_METHODS:
            return handler
        metadata: Sequence[tuple[str, str | bytes]] | None = (
            handler_call_details.invocation_metadata
        )
        if self._tokens.admits(metadata):
            return handler
        return refusing(handler, grpc.StatusCode.UNAUTHENTICATED, READ_REFUSAL)
