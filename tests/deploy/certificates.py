"""The TLS facts of a rendered kustomization: which certificate each Secret holds (a demo Secret's
PEM, or what a cert-manager Certificate will write into it), which Secret key a mounted file
comes from, and the control plane's exec health probes.

A Secret that a cert-manager Certificate writes is not in the render; its certificate's names
are the Certificate's spec, and its keys those cert-manager writes (tls.crt, tls.key, ca.crt).
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from types import ModuleType

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.deploy.manifests import KUBERNETES_DIR, Manifests, Obj, pod_spec

REPO = Path(__file__).parents[2]
PROBE_SCRIPT = KUBERNETES_DIR / "base" / "probes" / "grpc_health_check.py"
DEMO_CERTS_SCRIPT = REPO / "scripts" / "make_demo_certs.py"
CERT_MANAGER_GROUP = "cert-manager.io"
_USAGE_NAMES = {
    ExtendedKeyUsageOID.SERVER_AUTH: "server auth",
    ExtendedKeyUsageOID.CLIENT_AUTH: "client auth",
}


@dataclass(frozen=True)
class IssuedCertificate:
    """The certificate a kubernetes.io/tls Secret holds, or will hold once cert-manager wrote it."""

    secret: str
    common_name: str | None
    dns_names: frozenset[str]
    usages: frozenset[str]
    """Extended key usages, in cert-manager's words (`server auth`, `client auth`)."""
    source: str
    """`demo` (a Secret of the render) or `cert-manager` (a Certificate of the render)."""
    is_ca: bool = False
    """A CA's certificate (cert-manager's CA Certificate), not a role's."""

    @property
    def names(self) -> frozenset[str]:
        """The identities a stream allow-list may name: the CN and every DNS SAN."""
        cn = frozenset() if self.common_name is None else frozenset({self.common_name})
        return self.dns_names | cn


def load_script(path: Path, name: str) -> ModuleType:
    """A Python file that is no package's module (a script, the probe), imported by path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def probe_module() -> ModuleType:
    return load_script(PROBE_SCRIPT, "slotshift_grpc_health_check")


@cache
def demo_certs_module() -> ModuleType:
    return load_script(DEMO_CERTS_SCRIPT, "slotshift_make_demo_certs")


def from_pem(secret: str, pem: bytes) -> IssuedCertificate:
    """The facts of a PEM certificate held by `secret`."""
    cert = x509.load_pem_x509_certificate(pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = frozenset(sans.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = frozenset()
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        usages = frozenset(_USAGE_NAMES.get(oid, oid.dotted_string) for oid in eku)
    except x509.ExtensionNotFound:
        usages = frozenset()
    common_name = str(cns[0].value) if cns else None
    return IssuedCertificate(secret, common_name, dns, usages, "demo")


def issued_certificates(manifests: Manifests) -> dict[str, IssuedCertificate]:
    """Every TLS Secret of the render by name: the demo Secrets' certificates and those the
    cert-manager Certificates write. AssertionError when both provide one name."""
    found: dict[str, IssuedCertificate] = {}
    for secret in manifests.of_kind("Secret"):
        if secret.get("type") != "kubernetes.io/tls":
            continue
        name = secret["metadata"]["name"]
        found[name] = from_pem(name, base64.b64decode(secret["data"]["tls.crt"]))
    for certificate in cert_manager_objects(manifests, "Certificate"):
        spec = certificate["spec"]
        name = spec["secretName"]
        assert name not in found, f"{name}: a demo Secret and a Certificate both write it"
        found[name] = IssuedCertificate(
            name,
            spec.get("commonName"),
            frozenset(spec.get("dnsNames", [])),
            frozenset(spec.get("usages", ["digital signature", "key encipherment"])),
            "cert-manager",
            is_ca=bool(spec.get("isCA", False)),
        )
    return found


def cert_manager_objects(manifests: Manifests, kind: str) -> list[Obj]:
    return [
        o
        for o in manifests.of_kind(kind)
        if o["apiVersion"].partition("/")[0] == CERT_MANAGER_GROUP
    ]


def secret_keys(manifests: Manifests, secret: str) -> frozenset[str]:
    """The keys the Secret has (or, written by cert-manager, will have)."""
    return frozenset(manifests.secret_data(secret))


def secret_key_behind(
    manifests: Manifests, workload: Obj, container: Obj, path: PurePosixPath
) -> tuple[str, str, Obj]:
    """(Secret, key, mount) that the file `path` of the container comes from; AssertionError
    when no Secret volume mount holds it or the Secret lacks the key."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        root = PurePosixPath(mount["mountPath"])
        if not path.is_relative_to(root):
            continue
        volume = volumes[mount["name"]]
        assert "secret" in volume, f"{path} is mounted from {volume['name']}, not from a Secret"
        source = volume["secret"]
        relative = str(path.relative_to(root))
        if "items" in source:
            keys = [item["key"] for item in source["items"] if item["path"] == relative]
            assert keys, f"{path}: no item of {volume['name']} is {relative}"
            key = keys[0]
        else:
            key = relative
        name: str = source["secretName"]
        assert key in secret_keys(manifests, name), f"{path}: Secret {name} has no key {key}"
        return name, key, mount
    raise AssertionError(f"{path} is under no mount of {container['name']}")


def tls_secrets_mounted(manifests: Manifests, workload: Obj, container: Obj) -> set[str]:
    """The TLS Secrets (demo or cert-manager's) that the container mounts."""
    tls = set(issued_certificates(manifests))
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    mounted = set()
    for mount in container.get("volumeMounts", []):
        name = volumes[mount["name"]].get("secret", {}).get("secretName")
        if name in tls:
            mounted.add(name)
    return mounted


def health_probe_args(probe: Obj) -> argparse.Namespace:
    """The flags of an exec probe that runs the gRPC health-check script, as it parses them."""
    command = [str(part) for part in probe["exec"]["command"]]
    assert command[0] == "python", f"the probe runs {command[0]}, not the image's Python"
    assert PurePosixPath(command[1]).name == PROBE_SCRIPT.name, command
    args: argparse.Namespace = probe_module().build_parser().parse_args(command[2:])
    return args
