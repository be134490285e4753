"""Certificates made in the test for TLS tests: a CA of its own, a server certificate for
127.0.0.1 and localhost, and a client certificate, written as PEM files (EC P-256: fast to make).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_FOR = datetime.timedelta(days=1)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class TestPki:
    """A CA and the certificates it signed."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    ca_cert: Path
    server: KeyPair
    """For 127.0.0.1 and localhost (server authentication)."""
    client: KeyPair
    """For a client (client authentication), e.g. a gateway."""
    clients: dict[str, KeyPair] = field(default_factory=dict)
    """More client certificates, by name: each with that name as its CN and its one DNS SAN
    (the identities a stream allow-list names)."""


def make_pki(folder: Path, name: str = "slotshift-test", clients: Sequence[str] = ()) -> TestPki:
    """A fresh CA called `name` and a server and a client certificate it signed, in `folder`;
    and a client certificate for each of `clients` (TestPki.clients)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = folder / f"{name}-ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def leaf(
        role: str,
        usage: x509.ObjectIdentifier,
        names: list[x509.GeneralName],
        common_name: str | None = None,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = common_name if common_name is not None else f"{name} {role}"
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        pair = KeyPair(folder / f"{name}-{role}.pem", folder / f"{name}-{role}-key.pem")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return pair

    server = leaf(
        "server",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client = leaf("client", ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName("gateway")])
    named = {
        client_name: leaf(
            f"client-{client_name}",
            ExtendedKeyUsageOID.CLIENT_AUTH,
            [x509.DNSName(client_name)],
            common_name=client_name,
        )
        for client_name in clients
    }
    return TestPki(ca_path, server, client, named)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )
