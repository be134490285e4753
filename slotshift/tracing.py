"""One service process's tracer provider, built from the standard OpenTelemetry variables.

Each service's `main.run` calls `tracing_from_environment` once and hands `Tracing.provider` to the
objects it starts; nothing here sets OpenTelemetry's global provider, so tests and in-process
stacks keep their services' spans apart. Spans are exported over OTLP/gRPC (the protocol Jaeger
and the OpenTelemetry Collector take on port 4317) only when an endpoint is configured:

- `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`: where to export; with
  neither, the provider is a no-op and nothing is exported (tests, a laptop without a collector);
- `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`: no-op as well;
- `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`): the service name,
  otherwise the service's own default (`slotshift-controlplane`, `slotshift-gateway`, ...).

Everything else (`OTEL_TRACES_SAMPLER` and its argument, `OTEL_BSP_*` batching, the exporter's
headers, timeout, compression, TLS certificates, `OTEL_RESOURCE_ATTRIBUTES`) the SDK reads itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.environment_variables import OTEL_TRACES_EXPORTER
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

logger = logging.getLogger(__name__)

_UNNAMED_SERVICE = "unknown_service"
"""The SDK's service name when the environment gives none (it appends the executable's name)."""


class Tracing:
    """The tracer provider of one service process, and how to flush it when the service stops."""

    def __init__(self, provider: trace.TracerProvider, *, exporting_to: str | None) -> None:
        self.provider = provider
        """Give this to the service's objects; they take their tracers from it."""
        self.exporting_to = exporting_to
        """The OTLP endpoint spans go to; None when tracing is off."""

    @classmethod
    def disabled(cls) -> Tracing:
        """Tracing off: spans are not recorded, but incoming trace context still passes through."""
        return cls(trace.NoOpTracerProvider(), exporting_to=None)

    @property
    def service_name(self) -> str | None:
        """The `service.name` spans are exported under; None when tracing is off."""
        if isinstance(self.provider, TracerProvider):
            name = self.provider.resource.attributes.get(SERVICE_NAME)
            return str(name) if name is not None else None
        return None

    async def shutdown(self) -> None:
        """Export what is still batched and stop the exporter (at service stop)."""
        if isinstance(self.provider, TracerProvider):
            # Flushing is a blocking gRPC export, bounded by OTEL_EXPORTER_OTLP_TIMEOUT.
            await asyncio.to_thread(self.provider.shutdown)


def tracing_from_environment(
    default_service_name: str, environ: Mapping[str, str] | None = None
) -> Tracing:
    """Build the process's tracing from the OTEL_* variables (see the module docstring).

    Call it from a service's entrypoint only. `environ` is what decides whether to export and
    under which name (default: the process environment); the SDK reads its other settings from
    the process environment itself.
    """
    env = os.environ if environ is None else environ
    if env.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        logger.info("tracing off: %s is true", OTEL_SDK_DISABLED)
        return Tracing.disabled()
    exporters = {e.strip().lower() for e in env.get(OTEL_TRACES_EXPORTER, "otlp").split(",")}
    if exporters <= {"none", ""}:
        logger.info("tracing off: %s=none", OTEL_TRACES_EXPORTER)
        return Tracing.disabled()
    endpoint = env.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or env.get(OTEL_EXPORTER_OTLP_ENDPOINT)
    if not endpoint:
        logger.info(
            "tracing off: set %s to export spans over OTLP/gRPC", OTEL_EXPORTER_OTLP_ENDPOINT
        )
        return Tracing.disabled()
    if exporters - {"otlp", "none", ""}:
        logger.warning(
            "%s=%s: only otlp is supported; exporting over OTLP/gRPC",
            OTEL_TRACES_EXPORTER,
            env[OTEL_TRACES_EXPORTER],
        )
    protocol = env.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) or env.get(OTEL_EXPORTER_OTLP_PROTOCOL)
    if protocol and protocol.strip().lower() != "grpc":
        logger.warning("OTLP protocol %s is not supported; exporting over gRPC", protocol)
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith(_UNNAMED_SERVICE):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    # The service stops the provider itself (Tracing.shutdown), after its own orderly shutdown
    # and while the event loop still runs, rather than in an atexit hook.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracing = Tracing(provider, exporting_to=endpoint)
    logger.info(
        "tracing on: exporting spans over OTLP/gRPC to %s as %s", endpoint, tracing.service_name
    )
    return tracing
