"""The tenant comes from the API key alone."""

from __future__ import annotations

import pytest

from admission_gateway.auth import AuthenticationError, Authenticator
from slotshift.config import PoolConfig
from slotshift.keys import KeyDigester

DIGESTER = KeyDigester.keyed("test-key-digest-secret-of-32-bytes")
"""The deployment's digester in these tests (keyed, as shipped configs are)."""

AUTHENTICATOR = Authenticator([("key-a", "A"), ("key-a2", "A"), ("key-b", "B")], digester=DIGESTER)


@pytest.mark.parametrize(
    ("header", "tenant"),
    [
        pytest.param("Bearer key-a", "A", id="first-key"),
        pytest.param("Bearer key-a2", "A", id="second-key-same-tenant"),
        pytest.param("Bearer key-b", "B", id="other-tenant"),
        pytest.param("bearer key-b", "B", id="scheme-case-insensitive"),
        pytest.param("  Bearer   key-b  ", "B", id="extra-spaces"),
    ],
)
def test_a_known_key_names_its_tenant(header: str, tenant: str) -> None:
    assert AUTHENTICATOR.tenant_for(header) == tenant


@pytest.mark.parametrize(
    ("header", "code"),
    [
        pytest.param(None, "missing_api_key", id="missing"),
        pytest.param("", "missing_api_key", id="empty"),
        pytest.param("Bearer key-c", "invalid_api_key", id="unknown"),
        pytest.param("Bearer key-a-and-more", "invalid_api_key", id="prefix-of-known"),
        pytest.param("Bearer KEY-A", "invalid_api_key", id="case-matters"),
        pytest.param("Basic a2V5LWE=", "malformed_authorization", id="other-scheme"),
        pytest.param("Bearer", "malformed_authorization", id="no-token"),
        pytest.param("Bearer key-a key-b", "malformed_authorization", id="two-tokens"),
        pytest.param("key-a", "malformed_authorization", id="no-scheme"),
    ],
)
def test_anything_else_is_refused_without_revealing_keys(header: str | None, code: str) -> None:
    with pytest.raises(AuthenticationError) as caught:
        AUTHENTICATOR.tenant_for(header)
    assert caught.value.code == code
    assert "key-" not in str(caught.value)


def test_one_key_for_two_tenants_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="share an API key"):
        Authenticator([("same", "A"), ("same", "B")], digester=DIGESTER)


def test_empty_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        Authenticator([("", "A")], digester=DIGESTER)


def test_keys_come_from_the_pool_configuration() -> None:
    pool = PoolConfig.model_validate(
        {
            "name": "p",
            "budget_slots": 4,
            "tenants": [
                {"name": "A", "api_keys": ["ka1", "ka2"]},
                {"name": "B", "api_keys": ["kb"]},
            ],
        }
    )
    authenticator = Authenticator.for_pool(pool, digester=DIGESTER)
    assert [authenticator.tenant_for(f"Bearer {k}") for k in ("ka1", "ka2", "kb")] == [
        "A",
        "A",
        "B",
    ]


def test_replaced_digests_decide_who_is_authenticated() -> None:
    authenticator = Authenticator([("key-a", "A"), ("key-b", "B")], digester=DIGESTER)
    authenticator.replace_digests(
        [(DIGESTER.digest("key-a"), "A"), (DIGESTER.digest("key-c"), "C")]
    )
    assert authenticator.tenant_for("Bearer key-c") == "C"
    assert authenticator.tenant_for("Bearer key-a") == "A"
    with pytest.raises(AuthenticationError) as raised:
        authenticator.tenant_for("Bearer key-b")
    assert raised.value.code == "invalid_api_key"
    assert authenticator.tenants == {"A", "C"}


def test_digests_shared_by_two_tenants_change_nothing() -> None:
    authenticator = Authenticator([("key-a", "A")], digester=DIGESTER)
    with pytest.raises(ValueError, match="share an API key"):
        authenticator.replace_digests(
            [(DIGESTER.digest("key-x"), "A"), (DIGESTER.digest("key-x"), "B")]
        )
    assert authenticator.tenant_for("Bearer key-a") == "A"
