"""slotshift.tracing: the standard OTEL_* variables decide whether and how a service exports."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from slotshift.tracing import Tracing, tracing_from_environment
from tests.otlp_receiver import OtlpReceiver
from tests.support import wait_until

_OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_BSP_SCHEDULE_DELAY",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads the process environment: start every test without OTEL_* variables."""
    for name in _OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    await receiver.start()
    yield receiver
    await receiver.stop()


def _sdk(tracing: Tracing) -> TracerProvider:
    assert isinstance(tracing.provider, TracerProvider)
    return tracing.provider


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({}, id="no endpoint"),
        pytest.param({"OTEL_SERVICE_NAME": "x"}, id="a name but no endpoint"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"},
            id="sdk disabled",
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": " TRUE "},
            id="sdk disabled, spelled loosely",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                "OTEL_TRACES_EXPORTER": "none",
            },
            id="exporter none",
        ),
    ],
)
async def test_tracing_is_off_unless_an_endpoint_is_configured(environ: dict[str, str]) -> None:
    tracing = tracing_from_environment("slotshift-test", environ)
    assert isinstance(tracing.provider, trace.NoOpTracerProvider)
    assert tracing.exporting_to is None
    assert tracing.service_name is None
    span = tracing.provider.get_tracer("t").start_span("nothing")
    assert not span.is_recording()
    await tracing.shutdown()


async def test_an_incoming_context_passes_through_when_tracing_is_off() -> None:
    tracing = tracing_from_environment("slotshift-test", {})
    parent = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1))
    child = tracing.provider.get_tracer("t").start_span(
        "child", context=trace.set_span_in_context(trace.NonRecordingSpan(parent))
    )
    assert child.get_span_context() == parent


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
async def test_either_endpoint_variable_turns_export_on(variable: str) -> None:
    tracing = tracing_from_environment("slotshift-test", {variable: "http://127.0.0.1:4317"})
    assert tracing.exporting_to == "http://127.0.0.1:4317"
    assert _sdk(tracing).resource.attributes["service.name"] == "slotshift-test"
    await tracing.shutdown()


async def test_the_traces_endpoint_wins_over_the_general_one() -> None:
    tracing = tracing_from_environment(
        "slotshift-test",
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4317",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
        },
    )
    assert tracing.exporting_to == "http://traces:4317"
    await tracing.shutdown()


async def test_otel_service_name_overrides_the_services_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-eu-1")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    tracing = tracing_from_environment(
        "slotshift-gateway", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    )
    attributes = _sdk(tracing).resource.attributes
    assert attributes["service.name"] == "gateway-eu-1"
    assert attributes["deployment.environment"] == "staging"
    await tracing.shutdown()


async def test_a_service_name_in_the_resource_attributes_is_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=cp-blue")
    tracing = tracing_from_environment(
        "slotshift-controlplane", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    )
    assert tracing.service_name == "cp-blue"
    await tracing.shutdown()


@pytest.mark.parametrize(
    ("sampler", "argument", "expected"),
    [
        pytest.param("always_off", None, ALWAYS_OFF, id="always_off"),
        pytest.param(
            "parentbased_traceidratio",
            "0.25",
            ParentBased(TraceIdRatioBased(0.25)),
            id="parentbased_traceidratio",
        ),
    ],
)
async def test_the_sampler_comes_from_otel_traces_sampler(
    monkeypatch: pytest.MonkeyPatch, sampler: str, argument: str | None, expected: object
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if argument is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", argument)
    tracing = tracing_from_environment(
        "slotshift-test", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    )
    assert _sdk(tracing).sampler.get_description() == expected.get_description()  # type: ignore[attr-defined]
    await tracing.shutdown()


async def test_spans_reach_an_otlp_receiver_under_the_service_name(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    tracing = tracing_from_environment(
        "slotshift-test", {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    )
    tracer = tracing.provider.get_tracer("t")
    with tracer.start_as_current_span("first", attributes={"k": 1}):
        pass
    await wait_until(lambda: bool(receiver.spans()), message="the batched span to be exported")
    with tracer.start_as_current_span("last"):
        pass
    # Shutdown flushes what is still batched, whatever the schedule delay.
    await tracing.shutdown()
    spans = receiver.spans()
    assert [(s.service, s.name) for s in spans] == [
        ("slotshift-test", "first"),
        ("slotshift-test", "last"),
    ]
    assert spans[0].attributes == {"k": 1}
    assert spans[0].parent_span_id == ""
