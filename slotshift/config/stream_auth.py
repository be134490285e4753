"""Who may open the control plane's streams: the gateways' (GatewayService.Connect) and the
agents' (TelemetryService.StreamTelemetry). How a peer is checked: docs/operations.md,
"Stream authentication"; the check itself is controlplane/core/stream_identity.py."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from slotshift.config.base import ConfigModel, Name


class StreamClientIdentity(ConfigModel):
    """One mutual-TLS client identity allowed on a stream, and the pools it may serve."""

    name: Annotated[str, Field(min_length=1)]
    """The client certificate's subject common name (CN) or one of its DNS subject alternative
    names, as the CA signed it (grpc.aio's auth context: `x509_common_name`, `peer_dns`)."""

    pools: Literal["all"] | Annotated[list[Name], Field(min_length=1)]
    """The pools a peer with this identity may serve: a gateway may name only these in its
    hello, an agent only these in its reports; `all`: every pool, including pools added later
    by the admin API."""


class StreamAuthConfig(ConfigModel):
    """Credentials of the two stream roles. A peer passes every check its role configures: the
    token when the role has a token file, the certificate's identity when it has an allow-list.
    Each role needs at least one of them unless `insecure_allow_unauthenticated` is set: the
    control plane refuses to start otherwise (secure by default)."""

    gateway_token_file: str | None = None
    """A file of the tokens gateways present (`authorization: Bearer TOKEN` on Connect), one
    per line (blank lines and `#` comments skipped), such as a mounted Kubernetes Secret; read
    at start. Several lines let a token be rotated: add the new one, restart the control plane,
    move the gateways to it, remove the old one. Relative to the config file's folder."""

    agent_token_file: str | None = None
    """As gateway_token_file, for the telemetry agents' StreamTelemetry calls. Keep it
    different from the gateways' token: a peer presenting the other role's token is refused
    (PERMISSION_DENIED)."""

    gateway_identities: Annotated[list[StreamClientIdentity], Field(min_length=1)] | None = None
    """mutual TLS: the client-certificate identities that may connect as gateways, each with
    the pools it may serve; needs `controlplane.tls` with require_client_cert. A certificate
    that the CA signed but whose identity is not listed is refused (PERMISSION_DENIED). Unset:
    the certificate's identity is not checked for gateways (any the CA signed will do)."""

    agent_identities: Annotated[list[StreamClientIdentity], Field(min_length=1)] | None = None
    """As gateway_identities, for the telemetry agents."""

    insecure_allow_unauthenticated: bool = False
    """Let a role with neither a token file nor an allow-list open its streams unauthenticated.
    This opens the control plane's port to anyone who reaches it: any process may then register
    as a gateway of any pool, receive every tenant's API-key digests, report invented demand and
    hold budget, or send telemetry that steers the policies. For a closed test bench only."""

    def configures(self, role: Literal["gateway", "agent"]) -> bool:
        """Whether `role` has a token file or an allow-list (it is authenticated at all)."""
        if role == "gateway":
            return self.gateway_token_file is not None or self.gateway_identities is not None
        return self.agent_token_file is not None or self.agent_identities is not None

    @model_validator(mode="after")
    def _identities_are_unique(self) -> Self:
        for role, identities in (
            ("gateway_identities", self.gateway_identities),
            ("agent_identities", self.agent_identities),
        ):
            names = [identity.name for identity in identities or ()]
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                raise ValueError(f"{role}: {repeated} listed twice (merge their pools)")
        return self
