"""slotshift/keys.py KeyDigester: keyed digests (another secret, another digest), short key ids
that are not the digest, constant-time comparison, and a secret that never shows."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from admission_gateway.auth import Authenticator
from slotshift.keys import UNKEYED_SCHEME, KeyDigester

SECRET = "a-key-digest-secret-of-at-least-32-bytes"
OTHER = "another-key-digest-secret-of-32-bytes!!"


def test_a_keyed_digest_is_the_hmac_of_the_key_under_the_secret() -> None:
    digester = KeyDigester.keyed(SECRET)
    expected = hmac.new(SECRET.encode(), b"key-a", hashlib.sha256).digest()
    assert digester.digest("key-a") == expected
    assert digester.digest("key-a") != hashlib.sha256(b"key-a").digest()
    assert KeyDigester.keyed(SECRET).digest("key-a") == expected  # the same in every process
    assert len(digester.digest("\udcff")) == 32


def test_another_secret_gives_another_digest_and_another_scheme() -> None:
    one, other = KeyDigester.keyed(SECRET), KeyDigester.keyed(OTHER)
    assert one.digest("key-a") != other.digest("key-a")
    assert one.scheme != other.scheme
    assert one.scheme.startswith("hmac-sha256:") and len(one.secret_id) == 8
    assert KeyDigester.unkeyed().scheme == UNKEYED_SCHEME


def test_a_key_id_is_short_and_neither_the_digest_nor_a_prefix_of_it() -> None:
    digester = KeyDigester.keyed(SECRET)
    digest = digester.digest("key-a")
    key_id = digester.key_id(digest)
    assert len(key_id) == 8 and int(key_id, 16) >= 0
    assert key_id not in digest.hex()
    assert key_id != KeyDigester.keyed(OTHER).key_id(digest)
    assert key_id != digester.key_id(digester.digest("key-b"))


def test_a_short_secret_is_refused_and_the_secret_never_shows() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        KeyDigester.keyed("short")
    assert SECRET not in repr(KeyDigester.keyed(SECRET))


def test_matching_compares_in_constant_time_against_every_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    digester = KeyDigester.keyed(SECRET)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    assert digester.matches("key-a", digester.digest("key-a"))
    assert not digester.matches("key-b", digester.digest("key-a"))
    assert len(compared) == 2
    authenticator = Authenticator([("key-a", "A"), ("key-b", "B")], digester=digester)
    compared.clear()
    assert authenticator.tenant_for("Bearer key-a") == "A"
    # Every configured key is compared, the matching one first or not.
    assert len(compared) == 2
    assert all(len(a) == len(b) == 32 for a, b in compared)


def test_an_authenticator_of_another_secret_refuses_the_pushed_digests() -> None:
    pushed = KeyDigester.keyed(SECRET)
    gateway = Authenticator([], digester=KeyDigester.keyed(OTHER))
    gateway.replace_digests([(pushed.digest("key-a"), "A")])
    with pytest.raises(Exception, match="Incorrect API key"):
        gateway.tenant_for("Bearer key-a")
