"""The agent's section: the engines it watches, each with its pool, /metrics and GPUs; the
one-engine shorthand; what validation refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slotshift.config import (
    AgentConfig,
    AgentEngineConfig,
    ConfigError,
    apply_overrides,
    load_config,
    parse_config,
)
from tests.support import TEST_TENANT_KEYS

UUID_0 = "GPU-5b3a9c1e-2f4d-4e6a-9b7c-0d1e2f3a4b5c"
UUID_1 = "GPU-0c8e1d2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f"


def _engine(pool: str, port: int, **fields: Any) -> dict[str, Any]:
    return {"pool": pool, "metrics_url": f"http://127.0.0.1:{port}/metrics", **fields}


def _document(agent: dict[str, Any]) -> dict[str, Any]:
    pools = [{"name": name, "budget_slots": 8, "tenants": [{"name": "t"}]} for name in "ab"]
    return {"pools": pools, "agent": agent}


def test_the_shorthand_is_one_engine_on_every_gpu() -> None:
    config = AgentConfig.model_validate(
        {"pool": "a", "engine_metrics_url": "http://10.0.0.7:8000/metrics"}
    )

    assert config.watched_engines == (
        AgentEngineConfig(pool="a", metrics_url="http://10.0.0.7:8000/metrics", gpus=None),
    )


def test_an_empty_section_is_the_default_pool_on_localhost() -> None:
    (engine,) = AgentConfig().watched_engines

    assert (engine.pool, engine.metrics_url, engine.gpus, engine.gpus_file) == (
        "default",
        "http://127.0.0.1:8000/metrics",
        None,
        None,
    )


def test_engines_by_index_and_by_uuid() -> None:
    by_index = AgentConfig.model_validate(
        {"engines": [_engine("a", 8000, gpus=[0, 1]), _engine("b", 8001, gpus=[2])]}
    )
    by_uuid = AgentConfig.model_validate(
        {"engines": [_engine("a", 8000, gpus=[UUID_0]), _engine("b", 8001, gpus=[UUID_1])]}
    )

    assert [e.gpus for e in by_index.watched_engines] == [[0, 1], [2]]
    assert [e.gpus for e in by_uuid.watched_engines] == [[UUID_0], [UUID_1]]
    assert by_index.engine_of("b").metrics_url == "http://127.0.0.1:8001/metrics"
    with pytest.raises(KeyError):
        by_index.engine_of("c")


def test_a_lone_engine_may_leave_its_gpus_unset_and_one_may_have_none() -> None:
    lone = AgentConfig.model_validate({"engines": [_engine("a", 8000)]})
    cpu = AgentConfig.model_validate(
        {"engines": [_engine("a", 8000, gpus=[0]), _engine("b", 8001, gpus=[])]}
    )

    assert lone.watched_engines[0].gpus is None
    assert cpu.engine_of("b").gpus == []


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        pytest.param(
            {"engines": [_engine("a", 8000), _engine("b", 8001)]},
            r"engines of pools \['a', 'b'\] name no GPUs",
            id="several-engines-without-gpus",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[0]), _engine("b", 8001)]},
            r"engines of pools \['b'\] name no GPUs",
            id="one-of-several-without-gpus",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[0]), _engine("a", 8001, gpus=[1])]},
            r"pools repeat across engines: \['a'\]",
            id="duplicate-pool",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[0]), _engine("b", 8000, gpus=[1])]},
            r"metrics_url values repeat",
            id="duplicate-metrics-url",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[0, 1]), _engine("b", 8001, gpus=[1])]},
            r"gpus repeat across engines: \[1\]",
            id="duplicate-index-across-engines",
        ),
        pytest.param(
            {
                "engines": [
                    _engine("a", 8000, gpus=[UUID_0]),
                    _engine("b", 8001, gpus=["GPU-" + UUID_0[4:].upper()]),
                ]
            },
            r"gpus repeat across engines",
            id="duplicate-uuid-in-another-case",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[0, 0])]},
            r"engine of pool 'a': gpus repeat \[0\]",
            id="duplicate-within-an-engine",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[0]), _engine("b", 8001, gpus=[UUID_1])]},
            r"all by index or all by UUID",
            id="index-and-uuid-mixed",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[0], gpus_file="gpus")]},
            r"set gpus or gpus_file, not both",
            id="gpus-and-gpus-file",
        ),
        pytest.param(
            {"pool": "a", "engines": [_engine("a", 8000)]},
            r"pool: the one-engine shorthand",
            id="shorthand-pool-with-engines",
        ),
        pytest.param(
            {"engine_metrics_url": "http://x:1/metrics", "engines": [_engine("a", 8000)]},
            r"engine_metrics_url: the one-engine shorthand",
            id="shorthand-url-with-engines",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=[-1])]},
            r"engines\.0\.gpus\.0",
            id="negative-index",
        ),
        pytest.param(
            {"engines": [_engine("a", 8000, gpus=["MIG-1234abcd-0000"])]},
            r"engines\.0\.gpus\.0",
            id="not-a-gpu-uuid",
        ),
        pytest.param(
            {"engines": [{"pool": "a", "metrics_url": "127.0.0.1:8000/metrics"}]},
            r"engines\.0\.metrics_url",
            id="metrics-url-without-scheme",
        ),
    ],
)
def test_what_validation_refuses(agent: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_document(agent), source="test")


def test_an_engines_config_survives_overrides_and_a_shorthand_one_takes_them() -> None:
    engines = parse_config(
        _document({"engines": [_engine("a", 8000, gpus=[0]), _engine("b", 8001, gpus=[1])]})
    )
    shorthand = parse_config(_document({"pool": "a"}))

    moved = apply_overrides(engines, {"agent.engines.1.metrics_url": "http://h:9/metrics"})
    pointed = apply_overrides(shorthand, {"agent.engine_metrics_url": "http://h:9/metrics"})

    assert moved.agent.engine_of("b").metrics_url == "http://h:9/metrics"
    assert moved.agent.engine_of("a") == engines.agent.engine_of("a")
    assert pointed.agent.watched_engines[0].metrics_url == "http://h:9/metrics"
    assert pointed.agent.watched_engines[0].pool == "a"


def test_a_gpus_file_is_relative_to_the_config_folder(tmp_path: Path) -> None:
    document = _document({"engines": [_engine("a", 8000, gpus_file="run/engine-gpus")]})
    path = tmp_path / "slotshift.yaml"
    path.write_text(yaml.safe_dump({"tenant_keys": TEST_TENANT_KEYS, **document}))

    config = load_config(path)

    assert config.agent.engine_of("a").gpus_file == str(tmp_path / "run" / "engine-gpus")
