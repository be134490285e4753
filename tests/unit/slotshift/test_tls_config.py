"""The TLS sections of the config: validated on load, paths relative to the config file, and
loaders that name the file they cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotshift.config import ClientTlsConfig, ConfigError, ServerTlsConfig, load_config
from slotshift.tls import load_channel_security, load_server_credentials, server_ssl_context
from tests.pki import make_pki

_POOLS = """
pools:
  - name: default
    budget_slots: 4
    tenants: [{name: A}]
tenant_keys: {key_digest_secret: slotshift-tests-key-digest-secret-0123456789abcdef}
"""
_POOLS_WITH_ENGINE_TLS = """
pools:
  - name: default
    budget_slots: 4
    engine_url: https://engine:8000
    engine_tls: {ca_file: engine-ca.pem, cert_file: gw.pem, key_file: gw-key.pem}
    tenants: [{name: A}]
tenant_keys: {key_digest_secret: slotshift-tests-key-digest-secret-0123456789abcdef}
"""


def test_tls_is_off_unless_configured(tmp_path: Path) -> None:
    path = tmp_path / "slotshift.yaml"
    path.write_text(_POOLS)
    config = load_config(path)
    assert config.controlplane.tls is None
    assert config.gateway.tls is None
    assert config.gateway.controlplane_tls is None
    assert config.agent.controlplane_tls is None
    assert config.pools[0].engine_tls is None
    assert load_channel_security(None) is None


def test_relative_tls_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    path = folder / "slotshift.yaml"
    path.write_text(
        _POOLS_WITH_ENGINE_TLS
        + """
controlplane:
  tls: {cert_file: certs/cp.pem, key_file: certs/cp-key.pem, ca_file: /abs/ca.pem,
        require_client_cert: true}
gateway:
  tls: {cert_file: gw.pem, key_file: gw-key.pem}
  controlplane_tls: {ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem,
                     server_name: controlplane.internal}
agent:
  controlplane_tls: {ca_file: ca.pem}
"""
    )
    config = load_config(path)
    cp_tls = config.controlplane.tls
    assert cp_tls is not None
    assert cp_tls.cert_file == str(folder / "certs" / "cp.pem")
    assert cp_tls.key_file == str(folder / "certs" / "cp-key.pem")
    assert cp_tls.ca_file == "/abs/ca.pem"
    assert cp_tls.require_client_cert
    assert config.gateway.tls is not None
    assert config.gateway.tls.cert_file == str(folder / "gw.pem")
    assert config.gateway.tls.ca_file is None
    client = config.gateway.controlplane_tls
    assert client is not None
    assert (client.ca_file, client.cert_file, client.key_file) == (
        str(folder / "ca.pem"),
        str(folder / "client.pem"),
        str(folder / "client-key.pem"),
    )
    assert client.server_name == "controlplane.internal"
    assert config.agent.controlplane_tls == ClientTlsConfig(ca_file=str(folder / "ca.pem"))
    assert config.pools[0].engine_tls == ClientTlsConfig(
        ca_file=str(folder / "engine-ca.pem"),
        cert_file=str(folder / "gw.pem"),
        key_file=str(folder / "gw-key.pem"),
    )


def test_requiring_client_certs_needs_a_ca(tmp_path: Path) -> None:
    path = tmp_path / "slotshift.yaml"
    path.write_text(
        _POOLS + "controlplane:\n  tls: {cert_file: a, key_file: b, require_client_cert: true}\n"
    )
    with pytest.raises(ConfigError, match=r"controlplane\.tls.*require_client_cert needs ca_file"):
        load_config(path)


def test_a_client_cert_needs_its_key(tmp_path: Path) -> None:
    path = tmp_path / "slotshift.yaml"
    path.write_text(_POOLS + "agent:\n  controlplane_tls: {cert_file: client.pem}\n")
    with pytest.raises(ConfigError, match=r"agent\.controlplane_tls.*cert_file and key_file"):
        load_config(path)


def test_an_unknown_tls_field_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "slotshift.yaml"
    path.write_text(_POOLS + "gateway:\n  controlplane_tls: {require_client_cert: true}\n")
    with pytest.raises(ConfigError, match=r"gateway\.controlplane_tls\.require_client_cert"):
        load_config(path)


def test_loaders_name_the_file_they_cannot_read(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"ca_file: cannot read .*missing\.pem"):
        load_channel_security(ClientTlsConfig(ca_file=missing))
    with pytest.raises(ConfigError, match=r"key_file: cannot read .*missing\.pem"):
        load_server_credentials(ServerTlsConfig(cert_file=missing, key_file=missing))
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        server_ssl_context(ServerTlsConfig(cert_file=missing, key_file=missing))


def test_loaders_accept_generated_certificates(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    mutual = ServerTlsConfig(
        cert_file=str(pki.server.cert),
        key_file=str(pki.server.key),
        ca_file=str(pki.ca_cert),
        require_client_cert=True,
    )
    assert load_server_credentials(mutual) is not None
    context = server_ssl_context(mutual)
    assert context.verify_mode.name == "CERT_REQUIRED"
    security = load_channel_security(
        ClientTlsConfig(
            ca_file=str(pki.ca_cert),
            cert_file=str(pki.client.cert),
            key_file=str(pki.client.key),
            server_name="localhost",
        )
    )
    assert security is not None
    assert security.options == (("grpc.ssl_target_name_override", "localhost"),)
