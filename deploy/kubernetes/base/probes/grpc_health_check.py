"""gRPC health check over (mutual) TLS: the control plane's liveness and readiness probes.

The kubelet's own `grpc` probe speaks plaintext only, and the control plane's gRPC port takes
TLS alone and asks every caller for a client certificate; so the probes are exec probes running
this file (mounted from the ConfigMap slotshift-probes) with the image's Python, presenting the
control plane's own certificate (issued for client authentication too) from inside its pod.

Exit status: 0 when the service reports SERVING; 1 when it reports anything else, or the call
fails (refused, TLS handshake failed, deadline exceeded); 2 for bad arguments. Only grpcio and
grpcio-health-checking are imported, so that a probe costs one short Python start.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def build_parser() -> argparse.ArgumentParser:
    """The probe's flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="host:port of the gRPC server")
    parser.add_argument("--service", default="", help="the service checked; '': the server")
    parser.add_argument("--ca-file", required=True, help="CA of the server's certificate (PEM)")
    parser.add_argument("--cert-file", required=True, help="client certificate chain (PEM)")
    parser.add_argument("--key-file", required=True, help="the client certificate's key (PEM)")
    parser.add_argument(
        "--server-name",
        required=True,
        help="a name in the server's certificate (the dialled address is 127.0.0.1)",
    )
    parser.add_argument("--timeout-s", type=float, default=3.0, help="seconds for the whole call")
    return parser


def check(args: argparse.Namespace) -> tuple[bool, str]:
    """Call grpc.health.v1.Health/Check as `args` say: (SERVING, what was found)."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(args.ca_file).read_bytes(),
        private_key=Path(args.key_file).read_bytes(),
        certificate_chain=Path(args.cert_file).read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", args.server_name)]
    with grpc.secure_channel(args.address, credentials, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s
            )
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: Sequence[str]) -> int:
    """Run the check; the exit status says SERVING (0) or not (1)."""
    args = build_parser().parse_args(argv)
    try:
        serving, found = check(args)
    except OSError as exc:
        # A certificate file not (yet) mounted: unhealthy, not a crash the kubelet misreads.
        serving, found = False, f"cannot read a TLS file: {exc}"
    service = args.service or "the server"
    print(f"{service} at {args.address}: {found}", file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
