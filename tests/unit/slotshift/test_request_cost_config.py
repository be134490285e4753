"""pools[].request_cost: its validation, and the example docs/operations.md shows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from slotshift.config import ConfigError, RequestCostConfig, parse_config

OPERATIONS = Path(__file__).parents[3] / "docs" / "operations.md"


def _document(**request_cost: Any) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "default",
                "budget_slots": 8,
                "request_cost": request_cost,
                "tenants": [{"name": "A", "api_keys": ["key-a"]}],
            }
        ]
    }


def test_a_pool_weighs_nothing_unless_it_says_so() -> None:
    document = _document()
    del document["pools"][0]["request_cost"]
    assert parse_config(document).pool("default").request_cost is None


def test_the_defaults_estimate_by_length_at_four_characters_a_token() -> None:
    cost = (
        parse_config(_document(tokens_per_slot=256, max_model_len_tokens=4096))
        .pool("default")
        .request_cost
    )
    assert cost == RequestCostConfig(
        tokens_per_slot=256,
        max_model_len_tokens=4096,
        prompt_estimate="length",
        chars_per_token=4.0,
        tokenize_timeout_s=2.0,
    )


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        pytest.param(
            {"tokens_per_slot": 0, "max_model_len_tokens": 10}, "tokens_per_slot", id="zero"
        ),
        pytest.param(
            {"tokens_per_slot": 20, "max_model_len_tokens": 10},
            "max_model_len_tokens",
            id="slot-over-context",
        ),
        pytest.param({"tokens_per_slot": 1}, "max_model_len_tokens", id="context-missing"),
        pytest.param(
            {"tokens_per_slot": 1, "max_model_len_tokens": 8, "prompt_estimate": "guess"},
            "prompt_estimate",
            id="unknown-estimate",
        ),
        pytest.param(
            {"tokens_per_slot": 1, "max_model_len_tokens": 8, "chars_per_token": 0},
            "chars_per_token",
            id="chars-per-token",
        ),
    ],
)
def test_a_request_cost_that_cannot_work_is_rejected(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(_document(**fields))


def test_the_operations_doc_example_is_a_valid_config() -> None:
    section = OPERATIONS.read_text().split("## Token-weighted slots", 1)[1]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the section shows its config"
    config = parse_config(yaml.safe_load(match.group(1)))
    cost = config.pool("default").request_cost
    assert cost is not None and cost.tokens_per_slot == 512
