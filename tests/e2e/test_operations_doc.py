"""End to end: docs/operations.md and the Grafana dashboard say what the running services do.

- every grpcurl command in the doc's `sh` blocks runs, with the real grpcurl binary, against a
  running `slotshift up` (its address substituted for the doc's 127.0.0.1:50051);
- every JSON key in the doc's example outputs is a field of the API;
- every metric the doc names, and every metric a dashboard query reads, appears in a scrape of
  the running services.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from google.protobuf.descriptor import Descriptor
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from slotshift.v1 import (
    admin_pb2,
    allocation_pb2,
    common_pb2,
    gateway_pb2,
    query_pb2,
    telemetry_pb2,
)
from tests.e2e.conftest import ROOT, RunningStack
from tests.grpcurl import grpcurl_binary
from tests.support import wait_until_sync

pytestmark = pytest.mark.e2e

DOC = ROOT / "docs" / "operations.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "slotshift-dashboard.json"
DOC_ADDRESS = "127.0.0.1:50051"
MODEL = "Qwen/Qwen2.5-3B-Instruct"

_FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# A name followed by "/" or "." is a path or a module (slotshift_tools/replay.py), not a metric.
_METRIC_IN_TEXT = re.compile(r"\b(?:slotshift_[a-z0-9_]+(?![a-z0-9_]*[/.]\w)|vllm:[a-z0-9_:]+)")


def _blocks(language: str) -> list[str]:
    return [body for lang, body in _FENCED.findall(DOC.read_text()) if lang == language]


def doc_grpcurl_commands() -> list[str]:
    """The grpcurl commands of the doc's sh blocks, continuation lines joined."""
    commands = []
    for block in _blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("grpcurl "):
                commands.append(line.strip())
    return commands


@pytest.fixture(scope="module")
def used_stack(local_stack: RunningStack) -> RunningStack:
    """The stack after a request of each kind through each gateway, so that every labelled
    histogram has a series and every report has arrived."""
    for url in local_stack.gateway_urls:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="demo-key-a", max_retries=0)
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=4, extra_body={"ignore_eos": True}
        )
        list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
                extra_body={"ignore_eos": True},
            )
        )
    wait_until_sync(
        lambda: (
            "slotshift_controlplane_push_latency_seconds_count" in _scraped(local_stack)
            and "slotshift_controlplane_telemetry_age_seconds" in _scraped(local_stack)
        ),
        message="acknowledged pushes and telemetry at the control plane",
    )
    return local_stack


def _scraped(stack: RunningStack) -> set[str]:
    """Every metric family and sample name the services expose now."""
    names: set[str] = set()
    for url in stack.metrics_urls.values():
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
    return names


# grpcurl ----------------------------------------------------------------------------------


def test_the_doc_has_grpcurl_commands_for_every_query() -> None:
    commands = " ".join(doc_grpcurl_commands())
    queries = ("ListPools", "GetAllocation", "ListTenants", "GetDecisions", "Health/Check")
    admin = ("GetPoolConfig", "AddTenant", "UpdateTenant", "SetPolicy", "RemoveTenant")
    for method in (*queries, *admin):
        assert method in commands, f"docs/operations.md shows no grpcurl command for {method}"


@pytest.mark.parametrize("command", doc_grpcurl_commands())
def test_grpcurl_command_of_the_doc_runs(local_stack: RunningStack, command: str) -> None:
    assert DOC_ADDRESS in command, "every command names the control plane's address"
    argv = shlex.split(command.replace(DOC_ADDRESS, local_stack.grpc_target))
    result = subprocess.run(
        [grpcurl_binary(), *argv[1:]], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    assert result.stdout.strip()
    if "/" in argv[-1]:
        reply = json.loads(result.stdout)
        assert isinstance(reply, dict) and reply


def _field_names() -> set[str]:
    names: set[str] = set()

    def walk(descriptor: Descriptor) -> None:
        for field in descriptor.fields:
            names.add(field.name)
        for nested in descriptor.nested_types:
            walk(nested)

    modules = (admin_pb2, allocation_pb2, common_pb2, gateway_pb2, query_pb2, telemetry_pb2)
    for module in (*modules, health_pb2):
        for message in module.DESCRIPTOR.message_types_by_name.values():
            walk(message)
    return names


def _keys(document: Any) -> Iterator[str]:
    if isinstance(document, dict):
        for key, value in document.items():
            yield key
            yield from _keys(value)
    elif isinstance(document, list):
        for item in document:
            yield from _keys(item)


def test_the_docs_example_outputs_use_the_apis_field_names() -> None:
    examples = _blocks("json")
    assert examples
    fields = _field_names()
    for example in examples:
        unknown = set(_keys(json.loads(example))) - fields
        assert not unknown, f"docs/operations.md shows fields the API does not have: {unknown}"


# metrics ----------------------------------------------------------------------------------


def test_every_metric_the_doc_names_is_exposed(used_stack: RunningStack) -> None:
    named = set(_METRIC_IN_TEXT.findall(DOC.read_text()))
    assert len(named) > 30
    missing = named - _scraped(used_stack)
    assert not missing, f"docs/operations.md names metrics no service exposes: {sorted(missing)}"


_PROMQL_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")
_PROMQL_MATCHERS = re.compile(r"\{[^}]*\}")
_PROMQL_RANGE = re.compile(r"\[[^\]]*\]")
_PROMQL_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_PROMQL_IDENTIFIER = re.compile(r"(?<![$\w:.])[A-Za-z_:][A-Za-z0-9_:]*")
_PROMQL_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
    }
)


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are neither functions,
    keywords, label names nor Grafana variables."""
    text = _PROMQL_STRING.sub('""', expr)
    for pattern in (_PROMQL_MATCHERS, _PROMQL_RANGE, _PROMQL_GROUPING):
        text = pattern.sub(" ", text)
    names = set()
    for match in _PROMQL_IDENTIFIER.finditer(text):
        name = match.group()
        if name.lower() in _PROMQL_KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(name)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        pytest.param('up{job="x"}', {"up"}, id="selector"),
        pytest.param(
            'sum by (tenant, reason) (rate(a_total{pool=~"$pool"}[$__rate_interval]))',
            {"a_total"},
            id="aggregation",
        ),
        pytest.param(
            "histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))",
            {"h_bucket"},
            id="quantile",
        ),
        pytest.param("a / on (pool) group_left b", {"a", "b"}, id="vector matching"),
        pytest.param(
            "vllm:kv_cache_usage_perc > bool 0.9", {"vllm:kv_cache_usage_perc"}, id="colons"
        ),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def _dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def _dashboard_queries() -> list[str]:
    dashboard = _dashboard()
    queries = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        if variable["type"] == "query" and isinstance(query, str):
            label_values = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            queries.append(label_values.group(1) if label_values else query)
    return queries


def test_the_dashboard_reads_prometheus_through_its_datasource_variable() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_dashboard_query_reads_metrics_the_services_expose(used_stack: RunningStack) -> None:
    scraped = _scraped(used_stack)
    queries = _dashboard_queries()
    for query in queries:
        names = promql_metric_names(query)
        assert names, f"no metric in {query!r}"
        missing = names - scraped
        assert not missing, f"{query!r} reads metrics no service exposes: {sorted(missing)}"
    read = set().union(*(promql_metric_names(q) for q in queries))
    for wanted in (
        "slotshift_controlplane_tenant_limit_slots",
        "slotshift_controlplane_tenant_demand_slots",
        "slotshift_gateway_requests_rejected_total",
        "slotshift_gateway_queue_wait_seconds_bucket",
        "slotshift_controlplane_decision_duration_seconds_bucket",
        "slotshift_controlplane_push_latency_seconds_bucket",
        "slotshift_agent_gpu_utilization_ratio",
        "slotshift_agent_engine_kv_cache_usage_ratio",
        "slotshift_controlplane_telemetry_age_seconds",
    ):
        assert wanted in read, f"the dashboard has no panel on {wanted}"
