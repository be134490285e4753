"""Make the demo certificates of the Kubernetes base (deploy/kubernetes/base/tls/).

DEMO ONLY: replace them before use. Anyone with this repository holds these private keys. The
cert-manager component (deploy/kubernetes/components/cert-manager) issues real ones into the same
Secrets; or generate the Secrets from your own CA.

One CA, then one certificate per role, each a `kubernetes.io/tls` Secret of the base
(kustomization.yaml) with the CA as `ca.crt`, as cert-manager writes them:

- `controlplane`: the control plane's gRPC server certificate, for every name its Services
  answer to (`slotshift-controlplane`, and `slotshift-controlplane-query` of components/ha, each
  short and qualified); it is a client certificate too, for the exec probes that check its
  health over mutual TLS from inside its pod.
- `gateway`, `agent`: client certificates whose name (CN and DNS SAN) the control plane's
  stream allow-lists name (controlplane.stream_auth.gateway_identities, agent_identities).
- `operator`: a client certificate for grpcurl (the control plane asks every caller for one),
  on no allow-list: it cannot open a stream.

The CA's key is not written: making a new set makes a new CA. Usage:
    .venv/bin/python scripts/make_demo_certs.py [OUT_DIR]
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

OUT_DIR = Path(__file__).parents[1] / "deploy" / "kubernetes" / "base" / "tls"
NAMESPACE = "slotshift"
CONTROLPLANE_SERVICES = ("slotshift-controlplane", "slotshift-controlplane-query")
VALID_FOR = datetime.timedelta(days=10 * 365)
CA_COMMON_NAME = "slotshift demo CA (replace before use)"


@dataclass(frozen=True)
class Role:
    """One certificate of the set: its file stem, subject CN, DNS SANs and extended usages."""

    name: str
    common_name: str
    dns_names: tuple[str, ...]
    usages: tuple[x509.ObjectIdentifier, ...]


def service_dns_names(service: str, namespace: str = NAMESPACE) -> tuple[str, ...]:
    """Every name a pod of the namespace may dial a Service by: short, with the namespace, and
    the two cluster-qualified forms."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def _client(name: str) -> Role:
    return Role(
        name, f"slotshift-{name}", (f"slotshift-{name}",), (ExtendedKeyUsageOID.CLIENT_AUTH,)
    )


ROLES: tuple[Role, ...] = (
    Role(
        "controlplane",
        "slotshift-controlplane",
        tuple(name for service in CONTROLPLANE_SERVICES for name in service_dns_names(service)),
        (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    ),
    _client("gateway"),
    _client("agent"),
    _client("operator"),
)


def make_demo_certs(out_dir: Path, now: datetime.datetime, roles: Sequence[Role] = ROLES) -> None:
    """Write `ca.crt` and, for each role, `ROLE.crt` and `ROLE.key` (PKCS#8 PEM, unencrypted)
    into `out_dir`, every certificate valid from five minutes before `now` for VALID_FOR. EC
    P-256 keys; leaves are end-entity certificates for their `usages` only."""
    out_dir.mkdir(parents=True, exist_ok=True)
    not_before = now - datetime.timedelta(minutes=5)
    not_after = now + VALID_FOR
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (out_dir / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for role in roles:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, role.common_name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(role.usages)), critical=False)
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(name) for name in role.dns_names]),
                critical=False,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        (out_dir / f"{role.name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (out_dir / f"{role.name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


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


def main(argv: Sequence[str]) -> int:
    """Write the set into argv[0] (default: the base's tls/ folder); 0 when written."""
    if len(argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(argv[0]) if argv else OUT_DIR
    make_demo_certs(out_dir, datetime.datetime.now(datetime.UTC))
    print(f"wrote ca.crt and {', '.join(r.name for r in ROLES)} (.crt, .key) to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
