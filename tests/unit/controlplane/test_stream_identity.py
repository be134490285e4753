"""The pure stream-identity check: presented token and certificate identities, role and pools,
against the configured credentials -> a peer, UNAUTHENTICATED or PERMISSION_DENIED."""

from __future__ import annotations

import pytest

from controlplane.core.stream_identity import (
    RejectionCode,
    RoleCredentials,
    StreamCredentials,
    StreamPeer,
    StreamRejection,
    StreamRole,
    authenticate,
    check_stream_peer,
)

GATEWAY, AGENT = StreamRole.GATEWAY, StreamRole.AGENT
OK = None
UNAUTH, DENIED = RejectionCode.UNAUTHENTICATED, RejectionCode.PERMISSION_DENIED

TOKENS = StreamCredentials(
    {
        GATEWAY: RoleCredentials.of(["gw-old", "gw-new"]),
        AGENT: RoleCredentials.of(["agent-token"]),
    }
)
CERTS = StreamCredentials(
    {
        GATEWAY: RoleCredentials.of(
            identities={"gw-a": ["a"], "gw-ab": ["a", "b"], "gw-any": None}
        ),
        AGENT: RoleCredentials.of(identities={"agent-1": ["a"]}),
    }
)
BOTH = StreamCredentials(
    {
        GATEWAY: RoleCredentials.of(["gw-token"], {"gw-a": ["a"]}),
        AGENT: RoleCredentials.of(["agent-token"], {"agent-1": None}),
    }
)


def _code(result: StreamPeer | StreamRejection) -> RejectionCode | None:
    return result.code if isinstance(result, StreamRejection) else None


@pytest.mark.parametrize(
    ("credentials", "role", "authorization", "names", "pools", "expected"),
    [
        pytest.param(TOKENS, GATEWAY, "Bearer gw-old", [], ["a"], OK, id="token"),
        pytest.param(TOKENS, GATEWAY, "Bearer gw-new", [], ["a"], OK, id="rotated token"),
        pytest.param(TOKENS, GATEWAY, "bearer  gw-new ", [], ["z"], OK, id="scheme any case"),
        pytest.param(TOKENS, GATEWAY, None, [], ["a"], UNAUTH, id="no token"),
        pytest.param(TOKENS, GATEWAY, "", [], ["a"], UNAUTH, id="blank"),
        pytest.param(TOKENS, GATEWAY, "Basic gw-old", [], ["a"], UNAUTH, id="other scheme"),
        pytest.param(TOKENS, GATEWAY, "Bearer nope", [], ["a"], UNAUTH, id="wrong token"),
        pytest.param(TOKENS, GATEWAY, "Bearer gw-ol", [], ["a"], UNAUTH, id="a prefix"),
        pytest.param(TOKENS, GATEWAY, "Bearer agent-token", [], [], DENIED, id="agent token"),
        pytest.param(TOKENS, AGENT, "Bearer gw-old", [], [], DENIED, id="gateway token"),
        pytest.param(TOKENS, AGENT, "Bearer agent-token", [], ["x"], OK, id="agent"),
        pytest.param(CERTS, GATEWAY, None, ["gw-a"], ["a"], OK, id="cert of the pool"),
        pytest.param(CERTS, GATEWAY, None, ["gw-a"], ["b"], DENIED, id="cert of another pool"),
        pytest.param(CERTS, GATEWAY, None, ["gw-ab"], ["a", "b"], OK, id="cert of both"),
        pytest.param(CERTS, GATEWAY, None, ["gw-ab"], ["a", "c"], DENIED, id="every pool"),
        pytest.param(CERTS, GATEWAY, None, ["gw-any"], ["zz"], OK, id="cert of all pools"),
        pytest.param(CERTS, GATEWAY, None, ["x", "gw-a"], ["a"], OK, id="a SAN listed"),
        pytest.param(CERTS, GATEWAY, None, [], ["a"], UNAUTH, id="no cert"),
        pytest.param(CERTS, GATEWAY, None, ["agent-1"], ["a"], DENIED, id="agent's cert"),
        pytest.param(CERTS, GATEWAY, None, ["stranger"], ["a"], DENIED, id="unlisted cert"),
        pytest.param(CERTS, AGENT, None, ["agent-1"], ["b"], DENIED, id="agent other pool"),
        pytest.param(CERTS, GATEWAY, "Bearer x", ["gw-a"], ["a"], OK, id="token not asked"),
        pytest.param(BOTH, GATEWAY, "Bearer gw-token", ["gw-a"], ["a"], OK, id="both"),
        pytest.param(BOTH, GATEWAY, None, ["gw-a"], ["a"], UNAUTH, id="cert, no token"),
        pytest.param(BOTH, GATEWAY, "Bearer gw-token", [], ["a"], UNAUTH, id="token, no cert"),
        pytest.param(
            BOTH, GATEWAY, "Bearer gw-token", ["agent-1"], ["a"], DENIED, id="token, agent cert"
        ),
        pytest.param(BOTH, GATEWAY, None, ["agent-1"], ["a"], UNAUTH, id="unauth outranks"),
        pytest.param(
            BOTH, GATEWAY, "Bearer gw-token", ["gw-a"], ["b"], DENIED, id="token, other pool"
        ),
        pytest.param(StreamCredentials(), GATEWAY, None, [], ["a"], OK, id="open role"),
        pytest.param(
            StreamCredentials({AGENT: RoleCredentials.of(["t"])}),
            GATEWAY,
            None,
            [],
            ["a"],
            OK,
            id="only the other role checked",
        ),
    ],
)
def test_the_check_says_who_may_open_a_stream(
    credentials: StreamCredentials,
    role: StreamRole,
    authorization: str | None,
    names: list[str],
    pools: list[str],
    expected: RejectionCode | None,
) -> None:
    result = check_stream_peer(credentials, role, authorization, names, pools)
    assert _code(result) == expected, result
    if isinstance(result, StreamPeer):
        assert result.role is role


def test_a_rejection_never_names_the_token() -> None:
    for authorization in ("Bearer sekrit-value", "Bearer agent-token", "Basic sekrit-value"):
        result = authenticate(TOKENS, GATEWAY, authorization, [])
        assert isinstance(result, StreamRejection)
        assert "sekrit" not in result.reason and "agent-token" not in result.reason


def test_an_authenticated_peer_carries_the_pools_it_may_serve() -> None:
    peer = authenticate(CERTS, GATEWAY, None, ["gw-ab"])
    assert isinstance(peer, StreamPeer)
    assert peer.pools == frozenset({"a", "b"})
    assert peer.refusal_for(["a"]) is None
    refusal = peer.refusal_for(["a", "c"])
    assert refusal is not None and refusal.code is DENIED and "'c'" in refusal.reason
    token_peer = authenticate(TOKENS, GATEWAY, "Bearer gw-old", [])
    assert isinstance(token_peer, StreamPeer) and token_peer.pools is None
    assert token_peer.described == "token"


@pytest.mark.parametrize("tokens", [[], [""]], ids=["none", "empty"])
def test_a_role_admits_by_no_empty_token(tokens: list[str]) -> None:
    with pytest.raises(ValueError, match="at least one, none empty"):
        RoleCredentials.of(tokens)


def test_a_role_without_checks_is_open_and_one_with_any_is_not() -> None:
    assert RoleCredentials().open
    assert not RoleCredentials.of(["t"]).open
    assert not RoleCredentials.of(identities={"x": None}).open
