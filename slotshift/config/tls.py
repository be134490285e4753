"""TLS sections: a server's certificate (optionally asking for clients'), a client's trust and
certificate. The files are read by slotshift/tls.py; their paths are resolved by slotshift/config/paths.py."""

from __future__ import annotations

from pydantic import model_validator

from slotshift.config.base import ConfigModel


class ServerTlsConfig(ConfigModel):
    """TLS on a server (the control plane's gRPC API, a gateway's HTTP API), optionally mutual.

    Paths are PEM files; a relative path is relative to the config file's folder.
    """

    cert_file: str
    """The server's certificate chain (its certificate first); its names must match the address
    clients dial, or they set server_name."""

    key_file: str
    """The server certificate's private key (unencrypted PEM)."""

    ca_file: str | None = None
    """CA certificates that client certificates are checked against (mutual TLS); unset: clients
    are not asked for a certificate."""

    require_client_cert: bool = False
    """Refuse clients that present no certificate signed by ca_file (mutual TLS)."""

    @model_validator(mode="after")
    def _client_certs_need_a_ca(self) -> ServerTlsConfig:
        if self.require_client_cert and self.ca_file is None:
            raise ValueError("require_client_cert needs ca_file to check client certificates")
        return self


class ClientTlsConfig(ConfigModel):
    """TLS on a client's connection to a server (a gateway's or the agent's to the control plane,
    a gateway's to the engine), with a client certificate for mutual TLS.

    Paths are PEM files; a relative path is relative to the config file's folder.
    """

    ca_file: str | None = None
    """CA certificates the server's certificate is checked against; unset: the system's roots."""

    cert_file: str | None = None
    """This client's certificate chain, presented for mutual TLS; needs key_file."""

    key_file: str | None = None
    """The client certificate's private key (unencrypted PEM); needs cert_file."""

    server_name: str | None = None
    """The name the server's certificate must carry, when it differs from the host dialled (e.g.
    dialling an IP address or a port-forward); unset: the dialled host."""

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> ClientTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self
