"""The bearer-token check of gRPC calls (controlplane/service/read_auth.py): which tokens a call
may present, how it presents them, and which calls are the read-only ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.service.read_auth import (
    READ_METHODS,
    BearerTokens,
    authorization_of,
    load_read_tokens,
)
from slotshift.config import ConfigError
from slotshift.v1 import admin_pb2, query_pb2


@pytest.mark.parametrize(
    ("metadata", "admitted"),
    [
        pytest.param((("authorization", "Bearer old"),), True, id="first-token"),
        pytest.param((("authorization", "Bearer new"),), True, id="second-token"),
        pytest.param((("authorization", "bearer  new "),), True, id="scheme-any-case"),
        pytest.param((), False, id="none"),
        pytest.param(None, False, id="no-metadata"),
        pytest.param((("authorization", "Bearer other"),), False, id="wrong"),
        pytest.param((("authorization", "Bearer ne"),), False, id="prefix"),
        pytest.param((("authorization", "new"),), False, id="no-scheme"),
        pytest.param((("authorization", "Basic new"),), False, id="other-scheme"),
        pytest.param((("authorization", b"Bearer new"),), False, id="binary"),
        pytest.param((("x-token", "Bearer new"),), False, id="other-key"),
        pytest.param(
            (("authorization", "Bearer new"), ("authorization", "Bearer other")),
            False,
            id="last-one-counts",
        ),
    ],
)
def test_admits_only_a_bearer_of_one_of_its_tokens(
    metadata: tuple[tuple[str, str | bytes], ...] | None, admitted: bool
) -> None:
    assert BearerTokens(["old", "new"]).admits(metadata) is admitted


@pytest.mark.parametrize("tokens", [[], [""], ["a", ""]], ids=["none", "empty", "one-empty"])
def test_an_empty_token_list_or_token_is_refused(tokens: list[str]) -> None:
    with pytest.raises(ValueError, match="at least one, none empty"):
        BearerTokens(tokens)


def test_the_repr_names_no_token() -> None:
    assert "secret-token" not in repr(BearerTokens(["secret-token"]))


def test_authorization_of_is_the_last_text_value() -> None:
    assert authorization_of((("a", "1"), ("authorization", "x"), ("authorization", "y"))) == "y"
    assert authorization_of((("authorization", b"x"),)) is None
    assert authorization_of(None) is None


def test_the_read_methods_are_every_query_and_get_pool_config_only() -> None:
    queries = query_pb2.DESCRIPTOR.services_by_name["AllocationService"]
    admin = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
    assert {
        *(f"/{queries.full_name}/{m.name}" for m in queries.methods),
        f"/{admin.full_name}/GetPoolConfig",
    } == READ_METHODS
    assert len(READ_METHODS) == len(queries.methods) + 1
    assert f"/{admin.full_name}/SetPolicy" not in READ_METHODS
    assert "/grpc.health.v1.Health/Check" not in READ_METHODS


def test_load_read_tokens_takes_the_file_s_tokens_and_the_admin_token(tmp_path: Path) -> None:
    path = tmp_path / "query-tokens"
    path.write_text("# rotation\nold\n\nnew\n")
    tokens = load_read_tokens(str(path), "admin")
    assert tokens is not None
    for token in ("old", "new", "admin"):
        assert tokens.admits((("authorization", f"Bearer {token}"),)), token
    assert not tokens.admits((("authorization", "Bearer # rotation"),))
    assert load_read_tokens(None, "admin") is None, "no query token file: the reads are open"
    only_query = load_read_tokens(str(path), None)
    assert only_query is not None
    assert not only_query.admits((("authorization", "Bearer admin"),))


def test_load_read_tokens_refuses_a_file_without_a_token(tmp_path: Path) -> None:
    path = tmp_path / "query-tokens"
    path.write_text("# nothing\n\n")
    with pytest.raises(ConfigError, match=r"controlplane\.query_token_file: .* holds no token"):
        load_read_tokens(str(path), None)
