"""Mutual TLS on the control plane's gRPC API in the Kubernetes manifests.

Checked on every overlay and on the HA and emulator overlays with components/cert-manager: the
control plane requires client certificates and the gateways and agents present theirs, each pod
mounting its own certificate Secret only; the config's certificate paths are mounted Secret keys;
the control plane's certificate names every Service that reaches it; the stream allow-lists name
the client certificates of their role. The committed demo certificates, and a set the script
makes anew, form a valid chain for those names; the exec health probe works over mutual TLS.
"""

from __future__ import annotations

import base64
import copy
import datetime
import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import verification
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from slotshift.config import ClientTlsConfig, SlotshiftConfig, apply_overrides, parse_overrides
from slotshift_tools.cli import build_parser
from tests.deploy.certificates import (
    PROBE_SCRIPT,
    IssuedCertificate,
    cert_manager_objects,
    demo_certs_module,
    health_probe_args,
    issued_certificates,
    probe_module,
    secret_key_behind,
    tls_secrets_mounted,
)
from tests.deploy.manifests import (
    KUBERNETES_DIR,
    NAMESPACE,
    Manifests,
    Obj,
    expanded_args,
    pod_spec,
    render,
)
from tests.deploy.test_kubernetes_cross_checks import _config_seen_by
from tests.pki import make_pki

DEMO_DIR = KUBERNETES_DIR / "base" / "tls"
CERT_MANAGER = KUBERNETES_DIR / "components" / "cert-manager"
# The committed demo set must stay valid this long: past it, run scripts/make_demo_certs.py.
DEMO_VALID_FOR_AT_LEAST = datetime.timedelta(days=5 * 365)
ROLE_SECRETS = {
    "controlplane": "slotshift-controlplane-tls",
    "gateway": "slotshift-gateway-tls",
    "agent": "slotshift-agent-tls",
}
OPERATOR_SECRET = "slotshift-operator-tls"
CERT_MANAGER_BASES = ("emulator", "ha")
# The fields of cert-manager.io/v1 that these manifests may use (cert-manager's API reference);
# its CRDs are not shipped with kubernetes-validate, so this is the strict check instead.
CERT_MANAGER_SCHEMAS: dict[str, dict[str, Any]] = {
    "Issuer": {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
        "properties": {
            "selfSigned": {"type": "object", "additionalProperties": False},
            "ca": {
                "type": "object",
                "additionalProperties": False,
                "required": ["secretName"],
                "properties": {"secretName": {"type": "string"}},
            },
        },
    },
    "Certificate": {
        "type": "object",
        "additionalProperties": False,
        "required": ["secretName", "issuerRef"],
        "properties": {
            "secretName": {"type": "string"},
            "commonName": {"type": "string", "maxLength": 64},
            "dnsNames": {"type": "array", "items": {"type": "string"}},
            "isCA": {"type": "boolean"},
            "duration": {"type": "string", "pattern": r"^[0-9]+h$"},
            "renewBefore": {"type": "string", "pattern": r"^[0-9]+h$"},
            "usages": {
                "type": "array",
                "items": {
                    "enum": [
                        "digital signature",
                        "key encipherment",
                        "cert sign",
                        "crl sign",
                        "server auth",
                        "client auth",
                    ]
                },
            },
            "privateKey": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                    "size": {"type": "integer"},
                    "encoding": {"enum": ["PKCS1", "PKCS8"]},
                    "rotationPolicy": {"enum": ["Never", "Always"]},
                },
            },
            "issuerRef": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                    "group": {"const": "cert-manager.io"},
                },
            },
        },
    },
}


# --- renders: the overlays, and two of them with the cert-manager component -----------------


@pytest.fixture(scope="session")
def cert_manager_renders(
    kubectl: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Manifests]:
    """The emulator and HA overlays with components/cert-manager added, as an operator would."""
    renders = {}
    for name in CERT_MANAGER_BASES:
        folder = tmp_path_factory.mktemp(f"cert-manager-{name}")
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": NAMESPACE,
            # Kustomize takes no absolute paths.
            "resources": [os.path.relpath(KUBERNETES_DIR / "overlays" / name, folder)],
            "components": [os.path.relpath(CERT_MANAGER, folder)],
        }
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        renders[name] = render(kubectl, folder)
    return renders


RENDERS = [
    *(("overlay", p.name) for p in sorted((KUBERNETES_DIR / "overlays").iterdir())),
    *(("cert-manager", name) for name in CERT_MANAGER_BASES),
]


@pytest.fixture(params=RENDERS, ids=[f"{kind}-{name}" for kind, name in RENDERS])
def tls_render(
    request: pytest.FixtureRequest,
    renders: dict[Path, Manifests],
    cert_manager_renders: dict[str, Manifests],
) -> Manifests:
    """Each overlay, and each cert-manager variant, rendered."""
    kind, name = request.param
    if kind == "overlay":
        return renders[KUBERNETES_DIR / "overlays" / name]
    return cert_manager_renders[name]


# --- helpers ------------------------------------------------------------------------------


def _effective(manifests: Manifests, workload: Obj, container: Obj) -> SlotshiftConfig:
    args = build_parser().parse_args(expanded_args(workload, container))
    config = _config_seen_by(manifests, workload, container)
    return apply_overrides(config, parse_overrides(args.overrides))


def _peers(manifests: Manifests) -> Iterator[tuple[str, Obj, Obj, SlotshiftConfig]]:
    """(role, workload, container, its effective config) of every gRPC peer."""
    for workload, container in manifests.slotshift_containers():
        role = container["args"][0]
        if role in ROLE_SECRETS:
            yield role, workload, container, _effective(manifests, workload, container)


def _tls_files(role: str, config: SlotshiftConfig) -> dict[str, str]:
    """The role's TLS files on the gRPC hop, by the Secret key they must come from."""
    if role == "controlplane":
        server = config.controlplane.tls
        assert server is not None and server.ca_file is not None
        return {"tls.crt": server.cert_file, "tls.key": server.key_file, "ca.crt": server.ca_file}
    client: ClientTlsConfig | None = (
        config.gateway.controlplane_tls if role == "gateway" else config.agent.controlplane_tls
    )
    assert client is not None, f"the {role} dials the control plane without TLS"
    assert client.cert_file is not None and client.key_file is not None
    assert client.ca_file is not None, f"the {role} trusts the system's roots, not the CA"
    return {"tls.crt": client.cert_file, "tls.key": client.key_file, "ca.crt": client.ca_file}


def _controlplane_certificate(manifests: Manifests) -> IssuedCertificate:
    return issued_certificates(manifests)[ROLE_SECRETS["controlplane"]]


def _service_dns_names(service: str) -> set[str]:
    return set(demo_certs_module().service_dns_names(service, NAMESPACE))


def _check_server_names(manifests: Manifests) -> None:
    """The control plane's certificate is for server auth and names every Service selecting its
    pods on the gRPC port (in each form a pod may dial) and every address a client dials."""
    certificate = _controlplane_certificate(manifests)
    assert "server auth" in certificate.usages
    workload, container = manifests.workload_running("controlplane")
    config = _effective(manifests, workload, container)
    port = config.controlplane.grpc_port
    services = [
        s["metadata"]["name"]
        for s in manifests.of_kind("Service")
        if manifests.workloads_selected_by(s) == [workload]
        and any(p["port"] == port for p in s["spec"]["ports"])
    ]
    assert services
    for service in services:
        missing = _service_dns_names(service) - certificate.dns_names
        assert not missing, f"the control plane's certificate lacks {sorted(missing)}"
    for role, _, _, peer in _peers(manifests):
        if role == "controlplane":
            continue
        section = peer.gateway if role == "gateway" else peer.agent
        tls = section.controlplane_tls
        assert tls is not None
        targets = section.controlplane_target
        for target in [targets] if isinstance(targets, str) else targets:
            host = tls.server_name or target.rpartition(":")[0]
            assert host in certificate.dns_names, f"the {role} dials {host}, not in the certificate"


def _check_allow_lists(manifests: Manifests) -> None:
    """Each role's allow-list names its client certificate, which may serve the pools that role
    serves there; no certificate of another role (nor the operator's, nor the control plane's
    own) is on a list."""
    workload, container = manifests.workload_running("controlplane")
    auth = _effective(manifests, workload, container).controlplane.stream_auth
    certificates = issued_certificates(manifests)
    lists = {"gateway": auth.gateway_identities, "agent": auth.agent_identities}
    for role, identities in lists.items():
        assert identities is not None, f"no {role} identities: any certificate the CA signed passes"
        own = certificates[ROLE_SECRETS[role]]
        assert "client auth" in own.usages, f"the {role}s' certificate is not for client auth"
        listed = {identity.name for identity in identities}
        assert listed & own.names, f"the {role} allow-list {listed} does not name {own.names}"
        assert listed <= own.names, f"the {role} allow-list names {listed - own.names}, no {role}"
        others = [
            certificates[name]
            for name in (*ROLE_SECRETS.values(), OPERATOR_SECRET)
            if name != ROLE_SECRETS[role] and name in certificates
        ]
        for other in others:
            assert not listed & other.names, f"{other.secret} is on the {role} allow-list"
    for role, workload, _, peer in _peers(manifests):
        if role == "controlplane":
            continue
        identities = lists[role]
        assert identities is not None
        (identity,) = [i for i in identities if i.name in certificates[ROLE_SECRETS[role]].names]
        served = (
            [pool.name for pool in peer.fronted_pools()]
            if role == "gateway"
            else [engine.pool for engine in peer.agent.watched_engines]
        )
        if identity.pools != "all":
            assert set(served) <= set(identity.pools), (
                f"{workload['metadata']['name']}: its {role} serves {served}, not listed"
            )


# --- the config and the mounts ------------------------------------------------------------


def test_the_grpc_api_is_mutual_tls_on_top_of_the_stream_tokens(tls_render: Manifests) -> None:
    peers = list(_peers(tls_render))
    assert {role for role, *_ in peers} == set(ROLE_SECRETS)
    for role, workload, _, config in peers:
        auth = config.controlplane.stream_auth
        server = config.controlplane.tls
        assert server is not None and server.require_client_cert, workload["metadata"]["name"]
        assert auth.gateway_token_file is not None and auth.agent_token_file is not None
        assert auth.gateway_identities and auth.agent_identities
        assert not auth.insecure_allow_unauthenticated
        _tls_files(role, config)


def test_every_grpc_peer_reads_its_tls_files_from_its_own_secret_read_only(
    tls_render: Manifests,
) -> None:
    for role, workload, container, config in _peers(tls_render):
        name = f"{workload['metadata']['name']}/{container['name']}"
        for key, path in _tls_files(role, config).items():
            secret, found_key, mount = secret_key_behind(
                tls_render, workload, container, PurePosixPath(path)
            )
            assert (secret, found_key) == (ROLE_SECRETS[role], key), f"{name}: {path}"
            assert mount.get("readOnly") is True, f"{name}: {mount['mountPath']} is writable"
        # Its own certificate and no other role's: a gateway cannot present an agent's.
        assert tls_secrets_mounted(tls_render, workload, container) == {ROLE_SECRETS[role]}, name


def test_no_other_container_mounts_a_certificate(tls_render: Manifests) -> None:
    for workload in tls_render.workloads():
        for container in pod_spec(workload)["containers"]:
            args = container.get("args") or [""]
            if container["image"].startswith("slotshift") and args[0] in ROLE_SECRETS:
                continue
            mounted = tls_secrets_mounted(tls_render, workload, container)
            assert not mounted, f"{workload['metadata']['name']}/{container['name']}: {mounted}"
    # The operator's certificate is for grpcurl, outside the cluster's pods.
    assert OPERATOR_SECRET in issued_certificates(tls_render)


def test_the_control_plane_certificate_names_its_services_and_the_dialled_addresses(
    tls_render: Manifests,
) -> None:
    _check_server_names(tls_render)


def test_the_allow_lists_name_the_client_certificates_of_their_roles(
    tls_render: Manifests,
) -> None:
    _check_allow_lists(tls_render)


def test_every_secret_holds_a_certificate_of_one_ca(tls_render: Manifests) -> None:
    certificates = {n: c for n, c in issued_certificates(tls_render).items() if not c.is_ca}
    assert set(certificates) == {*ROLE_SECRETS.values(), OPERATOR_SECRET}
    sources = {c.source for c in certificates.values()}
    assert len(sources) == 1, "demo and cert-manager certificates mixed"
    if sources == {"demo"}:
        cas = {
            s["data"]["ca.crt"]
            for s in tls_render.of_kind("Secret")
            if s.get("type") == "kubernetes.io/tls"
        }
        assert len(cas) == 1, "the demo Secrets carry different CAs"


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("service-renamed", "certificate lacks .*cp-query"),
        ("san-dropped", r"certificate lacks \['slotshift-controlplane\.slotshift\.svc'\]"),
        ("target-elsewhere", "the agent dials 10.0.0.1, not in the certificate"),
    ],
)
def test_a_control_plane_name_missing_from_its_certificate_is_caught(
    cert_manager_renders: dict[str, Manifests], breakage: str, message: str
) -> None:
    broken = copy.deepcopy(cert_manager_renders["ha"])
    if breakage == "service-renamed":
        broken.one("Service", "slotshift-controlplane-query")["metadata"]["name"] = "cp-query"
    elif breakage == "san-dropped":
        (certificate,) = [
            c
            for c in cert_manager_objects(broken, "Certificate")
            if c["spec"]["secretName"] == ROLE_SECRETS["controlplane"]
        ]
        certificate["spec"]["dnsNames"].remove("slotshift-controlplane.slotshift.svc")
    else:
        _, agent = broken.workloads_running("agent")[0]
        agent["args"] += ["--set", "agent.controlplane_target=10.0.0.1:50051"]

    with pytest.raises(AssertionError, match=message):
        _check_server_names(broken)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("renamed", "the gateway allow-list .* does not name"),
        ("other-role", "the agent allow-list names {'slotshift-gateway'}, no agent"),
        ("pools", r"slotshift-engine-(small-b|large): its agent serves \['(small-b|large)'\]"),
    ],
)
def test_an_allow_list_that_misses_its_certificate_is_caught(
    renders: dict[Path, Manifests], breakage: str, message: str
) -> None:
    broken = copy.deepcopy(renders[KUBERNETES_DIR / "overlays" / "fleet-emulator"])
    (config_map,) = [c for c in broken.of_kind("ConfigMap") if "slotshift.yaml" in c["data"]]
    document = yaml.safe_load(config_map["data"]["slotshift.yaml"])
    auth = document["controlplane"]["stream_auth"]
    if breakage == "renamed":
        auth["gateway_identities"][0]["name"] = "gateway.example"
    elif breakage == "other-role":
        auth["agent_identities"].append({"name": "slotshift-gateway", "pools": "all"})
    else:
        auth["agent_identities"][0]["pools"] = ["small-a"]
    config_map["data"]["slotshift.yaml"] = yaml.safe_dump(document)

    with pytest.raises(AssertionError, match=message):
        _check_allow_lists(broken)


# --- the demo certificates ------------------------------------------------------------------


def _verify_set(folder: Path, at: datetime.datetime) -> None:
    """The set in `folder` as scripts/make_demo_certs.py makes it, checked at time `at`: each
    role's certificate chains to ca.crt for its usage and names, and its key is its own."""
    script = demo_certs_module()
    ca = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    store = verification.Store([ca])
    for role in script.ROLES:
        cert = x509.load_pem_x509_certificate((folder / f"{role.name}.crt").read_bytes())
        key = serialization.load_pem_private_key((folder / f"{role.name}.key").read_bytes(), None)
        assert key.public_key() == cert.public_key(), f"{role.name}.key is not its certificate's"
        policy = verification.PolicyBuilder().store(store).time(at)
        usages = {oid for oid in role.usages}
        if script.ExtendedKeyUsageOID.SERVER_AUTH in usages:
            for name in role.dns_names:
                policy.build_server_verifier(x509.DNSName(name)).verify(cert, [])
        if script.ExtendedKeyUsageOID.CLIENT_AUTH in usages:
            verified = policy.build_client_verifier().verify(cert, [])
            names = {n.value for n in verified.subjects or [] if isinstance(n, x509.DNSName)}
            assert names == set(role.dns_names), role.name


def test_the_committed_demo_certificates_are_valid_for_years() -> None:
    now = datetime.datetime.now(datetime.UTC)
    _verify_set(DEMO_DIR, now)
    _verify_set(DEMO_DIR, now + DEMO_VALID_FOR_AT_LEAST)


def test_a_broken_or_expired_set_fails_the_check(tmp_path: Path) -> None:
    script = demo_certs_module()
    now = datetime.datetime.now(datetime.UTC)
    script.make_demo_certs(tmp_path / "a", now)
    script.make_demo_certs(tmp_path / "b", now)
    # A gateway certificate and key of another CA: each matches the other, not the chain.
    for name in ("gateway.crt", "gateway.key"):
        (tmp_path / "a" / name).write_bytes((tmp_path / "b" / name).read_bytes())
    with pytest.raises(verification.VerificationError):
        _verify_set(tmp_path / "a", now)
    # A key that is not its certificate's.
    (tmp_path / "b" / "agent.key").write_bytes((tmp_path / "b" / "operator.key").read_bytes())
    with pytest.raises(AssertionError, match=r"agent\.key is not its certificate's"):
        _verify_set(tmp_path / "b", now)
    # Expired: the same set checked past its end.
    script.make_demo_certs(tmp_path / "c", now)
    with pytest.raises(verification.VerificationError):
        _verify_set(tmp_path / "c", now + script.VALID_FOR + datetime.timedelta(days=1))
    # And the set the script makes, intact, passes it (the committed set is one such).
    _verify_set(tmp_path / "c", now + DEMO_VALID_FOR_AT_LEAST)


def test_the_demo_certificates_name_what_the_cert_manager_certificates_name(
    renders: dict[Path, Manifests], cert_manager_renders: dict[str, Manifests]
) -> None:
    demo = issued_certificates(renders[KUBERNETES_DIR / "base"])
    issued = issued_certificates(cert_manager_renders["ha"])

    assert {c.source for c in demo.values()} == {"demo"}
    assert {c.source for c in issued.values()} == {"cert-manager"}
    for name, certificate in demo.items():
        other = issued[name]
        assert (certificate.common_name, certificate.dns_names) == (
            other.common_name,
            other.dns_names,
        ), name
        assert certificate.usages <= other.usages, name


def test_the_demo_secrets_hold_the_committed_files(renders: dict[Path, Manifests]) -> None:
    base = renders[KUBERNETES_DIR / "base"]
    ca = (DEMO_DIR / "ca.crt").read_bytes()
    for role in demo_certs_module().ROLES:
        secret = base.one("Secret", f"slotshift-{role.name}-tls")
        data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
        assert secret["type"] == "kubernetes.io/tls"
        assert data == {
            "tls.crt": (DEMO_DIR / f"{role.name}.crt").read_bytes(),
            "tls.key": (DEMO_DIR / f"{role.name}.key").read_bytes(),
            "ca.crt": ca,
        }


# --- cert-manager -------------------------------------------------------------------------


def test_cert_manager_issues_every_certificate_from_its_own_ca(
    cert_manager_renders: dict[str, Manifests],
) -> None:
    for manifests in cert_manager_renders.values():
        assert not [s for s in manifests.of_kind("Secret") if s.get("type") == "kubernetes.io/tls"]
        issuers = {
            i["metadata"]["name"]: i["spec"] for i in cert_manager_objects(manifests, "Issuer")
        }
        certificates = cert_manager_objects(manifests, "Certificate")
        (ca,) = [c for c in certificates if c["spec"].get("isCA")]
        # Self-signed Issuer -> the CA's Certificate -> the CA Issuer -> every role's.
        assert "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]
        (ca_issuer,) = [n for n, spec in issuers.items() if "ca" in spec]
        assert issuers[ca_issuer]["ca"]["secretName"] == ca["spec"]["secretName"]
        leaves = [c for c in certificates if c is not ca]
        assert {c["spec"]["secretName"] for c in leaves} == {
            *ROLE_SECRETS.values(),
            OPERATOR_SECRET,
        }
        for leaf in leaves:
            assert leaf["spec"]["issuerRef"] == {
                "name": ca_issuer,
                "kind": "Issuer",
                "group": "cert-manager.io",
            }
        # No pod mounts the CA's key.
        for workload in manifests.workloads():
            for volume in pod_spec(workload).get("volumes", []):
                assert volume.get("secret", {}).get("secretName") != ca["spec"]["secretName"]


@pytest.fixture(scope="module")
def kubernetes_validate() -> ModuleType:
    module: ModuleType = pytest.importorskip("kubernetes_validate")
    return module


def test_the_cert_manager_renders_validate(
    kubernetes_validate: ModuleType, cert_manager_renders: dict[str, Manifests]
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    version = kubernetes_validate.latest_version()
    problems = []
    for manifests in cert_manager_renders.values():
        for obj in manifests.objects:
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            if obj["apiVersion"].partition("/")[0] == "cert-manager.io":
                assert obj["apiVersion"] == "cert-manager.io/v1", name
                assert obj["metadata"].get("namespace") == NAMESPACE, name
                try:
                    jsonschema.validate(obj["spec"], CERT_MANAGER_SCHEMAS[obj["kind"]])
                except jsonschema.ValidationError as exc:
                    problems.append(f"{name}: {exc.message}")
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{name}: {exc}")
    assert not problems, "\n".join(problems)


def test_the_cert_manager_check_rejects_a_misspelt_field(
    cert_manager_renders: dict[str, Manifests],
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    certificate = copy.deepcopy(cert_manager_objects(cert_manager_renders["ha"], "Certificate")[0])
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames", [])

    with pytest.raises(jsonschema.ValidationError, match="dnsName"):
        jsonschema.validate(certificate["spec"], CERT_MANAGER_SCHEMAS["Certificate"])


# --- the exec health probes ---------------------------------------------------------------


def test_the_control_plane_probes_check_health_over_mtls_with_its_own_certificate(
    tls_render: Manifests,
) -> None:
    workload, container = tls_render.workload_running("controlplane")
    certificate = _controlplane_certificate(tls_render)
    assert "client auth" in certificate.usages, "the probes present the control plane's own"
    for kind in ("livenessProbe", "readinessProbe"):
        probe = container[kind]
        args = health_probe_args(probe)
        script = PurePosixPath(probe["exec"]["command"][1])
        files = tls_render.files_seen_by(workload, container)
        assert files[script] == PROBE_SCRIPT.read_bytes(), f"{script} is not the probe"
        assert args.server_name in certificate.dns_names
        for key, path in (
            ("ca.crt", args.ca_file),
            ("tls.crt", args.cert_file),
            ("tls.key", args.key_file),
        ):
            secret, found, _ = secret_key_behind(
                tls_render, workload, container, PurePosixPath(path)
            )
            assert (secret, found) == (ROLE_SECRETS["controlplane"], key), f"{kind}: {path}"
        assert probe.get("timeoutSeconds", 1) > args.timeout_s, (
            f"{kind}: the kubelet gives up first"
        )


class _HealthServer:
    """A gRPC server on 127.0.0.1 asking every client for a certificate of `pki`'s CA."""

    def __init__(self, ca: bytes, cert: bytes, key: bytes) -> None:
        self.health = health.HealthServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )
        self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def health_server(tmp_path: Path) -> Iterator[tuple[_HealthServer, Any]]:
    pki = make_pki(tmp_path / "pki")
    server = _HealthServer(
        pki.ca_cert.read_bytes(), pki.server.cert.read_bytes(), pki.server.key.read_bytes()
    )
    server.health.set("", health_pb2.HealthCheckResponse.SERVING)
    server.health.set("slotshift.v1.GatewayService", health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        yield server, pki
    finally:
        server.stop()


def _probe(server: _HealthServer, pki: Any, *extra: str, client: Any = None) -> int:
    pair = client or pki.client
    code: int = probe_module().main(
        [
            f"--address=127.0.0.1:{server.port}",
            "--server-name=localhost",
            f"--ca-file={pki.ca_cert}",
            f"--cert-file={pair.cert}",
            f"--key-file={pair.key}",
            "--timeout-s=5",
            *extra,
        ]
    )
    return code


def test_the_probe_passes_on_serving_and_fails_otherwise(
    health_server: tuple[_HealthServer, Any], tmp_path: Path
) -> None:
    server, pki = health_server

    assert _probe(server, pki) == 0
    assert _probe(server, pki, "--service=slotshift.v1.GatewayService") == 1
    assert _probe(server, pki, "--service=no.such.Service") == 1
    # A client certificate from another CA: the server refuses the handshake.
    stranger = make_pki(tmp_path / "stranger", name="stranger")
    assert _probe(server, pki, client=stranger.client) == 1
    # A name the server's certificate does not carry.
    assert _probe(server, pki, "--server-name=slotshift-controlplane") == 1
    # A certificate file not mounted (yet): unhealthy, not a traceback.
    assert _probe(server, pki, "--ca-file=/nonexistent/ca.crt") == 1

    server.health.set("slotshift.v1.GatewayService", health_pb2.HealthCheckResponse.SERVING)
    assert _probe(server, pki, "--service=slotshift.v1.GatewayService") == 0
