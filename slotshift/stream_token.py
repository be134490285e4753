"""The token a gateway or an agent presents on its stream to the control plane.

Each role has its own token (`gateway.controlplane_token_file`, `agent.controlplane_token_file`;
the control plane's `stream_auth` lists the tokens it accepts per role). It travels as
`authorization: Bearer TOKEN` call metadata on every stream the role opens, and is kept as a
SecretStr, so that it shows in no repr or log.
"""

from __future__ import annotations

from pydantic import SecretStr

from slotshift.config import read_secret_tokens, reveal


def read_stream_token(path: str | None, *, field: str) -> SecretStr | None:
    """The first token of `path` (a file of tokens, one per line, as `read_secret_tokens`
    reads it), None when no file is configured. ConfigError naming `field` when the file
    cannot be read or holds no token. Blocks: call it through asyncio.to_thread."""
    if path is None:
        return None
    return SecretStr(read_secret_tokens(path, field=field)[0])


def bearer_metadata(token: SecretStr | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents `token` (`authorization: Bearer TOKEN`); none without
    one."""
    if token is None:
        return ()
    return (("authorization", f"Bearer {reveal(token)}"),)
