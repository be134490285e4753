"""Key digests and Bearer tokens, as the gateways and the admin API read them."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slotshift.keys import BearerError, MalformedBearer, MissingBearer, bearer_token, key_digest


def test_a_key_digest_is_the_sha256_of_its_utf8_bytes() -> None:
    assert key_digest("key-a") == hashlib.sha256(b"key-a").digest()
    # A lone surrogate (possible in a str read from JSON) still has a digest.
    assert len(key_digest("\udcff")) == 32


@pytest.mark.parametrize(
    ("value", "token"),
    [
        pytest.param("Bearer abc.def", "abc.def", id="plain"),
        pytest.param("  bearer   abc  ", "abc", id="any case, white space around"),
    ],
)
def test_bearer_token_extracts_the_token(value: str, token: str) -> None:
    assert bearer_token(value) == token


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param(None, MissingBearer, id="absent"),
        pytest.param("   ", MissingBearer, id="blank"),
        pytest.param("Basic abc", MalformedBearer, id="another scheme"),
        pytest.param("Bearer", MalformedBearer, id="no token"),
        pytest.param("Bearer a b", MalformedBearer, id="white space in the token"),
    ],
)
def test_bearer_token_refuses_what_carries_no_token(
    value: str | None, error: type[BearerError]
) -> None:
    with pytest.raises(error):
        bearer_token(value)


@given(st.text(alphabet=st.sampled_from("ab\t \u00a0\u2003\x1c\x85\u3000-_=Z9"), max_size=12))
def test_a_token_is_refused_exactly_when_some_character_of_it_is_white_space(text: str) -> None:
    token = text.strip()
    if token and not any(c.isspace() for c in token):
        assert bearer_token("Bearer " + text) == token
    else:
        with pytest.raises(BearerError):
            bearer_token("Bearer " + text)
