"""TLS and mutual TLS for slotshift's connections, from the config's `ServerTlsConfig` and
`ClientTlsConfig`: gRPC server and channel credentials, and `ssl.SSLContext`s for HTTP.

Every loader here reads PEM files, so it blocks: services call them at start-up through
`asyncio.to_thread`. A section that is unset means plaintext, as `open_channel(target, None)`.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from slotshift.config import ClientTlsConfig, ConfigError, ServerTlsConfig, read_secret_file

ChannelOptions = Sequence[tuple[str, str | int]]


@dataclass(frozen=True)
class ChannelSecurity:
    """What a gRPC channel needs for TLS: its credentials and the options that go with them."""

    credentials: grpc.ChannelCredentials
    options: tuple[tuple[str, str], ...] = ()
    """e.g. the server name to check the certificate against, when it is not the dialled host."""


def load_channel_security(tls: ClientTlsConfig | None) -> ChannelSecurity | None:
    """Channel credentials for `tls` (None, plaintext, when it is unset). Blocks: reads files."""
    if tls is None:
        return None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_optional(tls.ca_file, "ca_file"),
        private_key=_read_optional(tls.key_file, "key_file"),
        certificate_chain=_read_optional(tls.cert_file, "cert_file"),
    )
    options: tuple[tuple[str, str], ...] = ()
    if tls.server_name is not None:
        options = (("grpc.ssl_target_name_override", tls.server_name),)
    return ChannelSecurity(credentials, options)


def open_channel(
    target: str, security: ChannelSecurity | None, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """A grpc.aio channel to `target`: over TLS with `security`, in plaintext without."""
    if security is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(
        target, security.credentials, options=[*options, *security.options]
    )


def load_server_credentials(tls: ServerTlsConfig) -> grpc.ServerCredentials:
    """gRPC server credentials for `tls` (asking for client certificates when it has a CA, and
    refusing clients without one when it requires them). Blocks: reads files."""
    return grpc.ssl_server_credentials(
        [(_read(tls.key_file, "key_file"), _read(tls.cert_file, "cert_file"))],
        root_certificates=_read_optional(tls.ca_file, "ca_file"),
        require_client_auth=tls.require_client_cert,
    )


def server_ssl_context(tls: ServerTlsConfig) -> ssl.SSLContext:
    """An SSLContext for an HTTPS server (the gateway), mutual when `tls` requires client
    certificates. Blocks: reads files."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.ca_file is not None:
            context.load_verify_locations(cafile=tls.ca_file)
            context.verify_mode = (
                ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files {tls.cert_file}, {tls.key_file}: {exc}") from exc
    return context


def client_ssl_context(tls: ClientTlsConfig) -> ssl.SSLContext:
    """An SSLContext for an HTTPS client that checks the server against `tls.ca_file` (or the
    system's roots) and presents a client certificate when `tls` has one. Blocks: reads files."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
        if tls.cert_file is not None and tls.key_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files: {exc}") from exc
    return context


def _read(path: str, field: str) -> bytes:
    return read_secret_file(path, field=f"TLS {field}")


def _read_optional(path: str | None, field: str) -> bytes | None:
    return None if path is None else _read(path, field)
