"""Replica groups in the config: the division of the group's slot figures among its members,
the validation of the group form, and its round trip through dumps, overrides and key files."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from slotshift.config import (
    ConfigError,
    TenantConfig,
    apply_overrides,
    divide_group,
    divide_slots,
    load_config,
    parse_config,
)

REPO = Path(__file__).parents[3]


def _document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "replica_groups": [
            {
                "name": "small",
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 6, "ceiling_slots": 30},
                    {"name": "B", "api_keys": ["key-b"], "weight": 3, "floor_slots": 1},
                ],
            }
        ],
        "pools": [
            {"name": "a", "replica_group": "small", "models": ["m"], "budget_slots": 32},
            {"name": "b", "replica_group": "small", "models": ["m"], "budget_slots": 16},
            {
                "name": "other",
                "models": ["n"],
                "budget_slots": 8,
                "tenants": [{"name": "A", "api_keys": ["key-a"]}],
            },
        ],
        "tenant_keys": {"unkeyed_key_digests": True},
    }
    document.update(changes)
    return document


def _bounds(config: Any, pool: str) -> dict[str, tuple[int, int | None, float]]:
    return {t.name: (t.floor_slots, t.ceiling_slots, t.weight) for t in config.pool(pool).tenants}


def test_members_take_the_groups_tenants_slot_figures_divided_by_budget() -> None:
    config = parse_config(_document())

    assert _bounds(config, "a") == {"A": (4, 20, 1.0), "B": (1, None, 3.0)}
    assert _bounds(config, "b") == {"A": (2, 10, 1.0), "B": (1, None, 3.0)}
    assert _bounds(config, "other") == {"A": (1, None, 1.0)}
    assert [p.name for p in config.members_of("small")] == ["a", "b"]
    assert config.replica_group("small").tenants[0].floor_slots == 6


@pytest.mark.parametrize(
    ("total", "budgets", "parts"),
    [
        pytest.param(10, [1, 1, 1], [4, 3, 3], id="ties-go-first"),
        pytest.param(7, [48, 16], [5, 2], id="largest-remainder"),
        pytest.param(0, [3, 5], [0, 0], id="nothing"),
        pytest.param(5, [5], [5], id="one-member"),
    ],
)
def test_slots_are_divided_by_largest_remainder(
    total: int, budgets: list[int], parts: list[int]
) -> None:
    assert divide_slots(total, budgets) == parts


def test_a_division_holds_its_contract_on_random_cases() -> None:
    rng = random.Random(16)
    for _ in range(5000):
        budgets = {f"p{i}": rng.randint(1, 200) for i in range(rng.randint(1, 5))}
        whole = sum(budgets.values())
        floor = rng.randint(0, whole)
        ceiling = rng.choice([None, rng.randint(floor, whole)])
        tenant = TenantConfig(name="T", floor_slots=floor, ceiling_slots=ceiling, weight=2.5)
        case = (budgets, floor, ceiling)

        members = divide_group([tenant], budgets)

        parts = divide_slots(floor, list(budgets.values()))
        assert sum(parts) == floor, case
        for part, budget in zip(parts, budgets.values(), strict=True):
            assert abs(part - floor * budget / whole) < 1, case
        got = [tenants[0] for tenants in members.values()]
        # The group's floor exactly, but for the members whose part rounded to 0: 1 there.
        lifted = sum(1 for part in parts if part == 0) if floor > 0 else 0
        assert sum(t.floor_slots for t in got) == floor + lifted, case
        for t, budget in zip(got, budgets.values(), strict=True):
            assert t.weight == 2.5
            assert t.floor_slots <= budget, case
            assert (t.floor_slots >= 1) == (floor > 0), case
        if ceiling is None:
            assert all(t.ceiling_slots is None for t in got)
        else:
            ceilings = divide_slots(ceiling, list(budgets.values()))
            assert sum(ceilings) == ceiling
            assert [t.ceiling_slots for t in got] == [
                max(c, t.floor_slots) for c, t in zip(ceilings, got, strict=True)
            ], case


def test_each_members_floors_fit_its_budget_or_the_config_says_which_does_not() -> None:
    document = _document()
    # A's 47 divide as 31 and 16, and B keeps 1 on each: 17 on b's 16 slots.
    document["replica_groups"][0]["tenants"][0].update(floor_slots=47, ceiling_slots=None)
    with pytest.raises(ConfigError, match=r"pools\.1: .*floor_slots sum to 17, above budget_sl"):
        parse_config(document)


def _with_pool(index: int, **fields: Any) -> dict[str, Any]:
    document = _document()
    document["pools"][index].update(fields)
    return document


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        pytest.param(
            _with_pool(0, replica_group="large"), "replica_group 'large': no such", id="unknown"
        ),
        pytest.param(
            _with_pool(1, tenants=[{"name": "A", "api_keys": ["key-a"]}]),
            "lists no tenants of its own",
            id="member-with-tenants",
        ),
        pytest.param(
            _with_pool(1, models=["m", "alias"]), "must list the same models", id="other-models"
        ),
        pytest.param(
            _with_pool(0, models=[]) | {"pools": _with_pool(0, models=[])["pools"][:1]},
            "must list the same models, at least one",
            id="no-models",
        ),
        pytest.param(
            _document(pools=_document()["pools"][2:]),
            "no pool names it as its replica_group",
            id="no-members",
        ),
        pytest.param(
            _document(replica_groups=_document()["replica_groups"] * 2),
            "the name 'small' repeats",
            id="group-twice",
        ),
        pytest.param(
            _document(replica_groups=[{"name": "small", "tenants": []}]),
            "needs at least one tenant",
            id="no-tenants",
        ),
        pytest.param(
            _document(replica_groups=[{"name": "small", "tenants": [{"name": "A", "x": 1}]}]),
            r"replica_groups\.0: tenants\.0\.x: Extra inputs",
            id="group-field-named",
        ),
    ],
)
def test_a_bad_group_is_refused_naming_the_problem(document: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(document)


def test_a_dump_is_the_group_form_and_an_override_divides_the_group_again() -> None:
    config = parse_config(_document())
    dumped = config.model_dump(mode="python")
    assert "tenants" not in dumped["pools"][0]
    assert "tenants" in dumped["pools"][2]

    changed = apply_overrides(
        config, {"pools.1.budget_slots": 32, "replica_groups.0.tenants.1.floor_slots": 4}
    )
    assert (
        _bounds(changed, "a")
        == _bounds(changed, "b")
        == {
            "A": (3, 15, 1.0),
            "B": (2, None, 3.0),
        }
    )


def test_a_group_tenants_key_file_reaches_every_member(tmp_path: Path) -> None:
    (tmp_path / "a-keys").write_text("# A's keys\nkey-a-from-file\n")
    document = _document()
    document["replica_groups"][0]["tenants"][0]["api_keys_file"] = "a-keys"
    document["pools"][2]["tenants"][0]["api_keys_file"] = "a-keys"
    (tmp_path / "slotshift.yaml").write_text(yaml.safe_dump(document))

    config = load_config(tmp_path / "slotshift.yaml")

    for pool in ("a", "b", "other"):
        tenant = config.pool(pool).tenants[0]
        assert [k.get_secret_value() for k in tenant.api_keys] == ["key-a", "key-a-from-file"]
        assert tenant.api_keys_file == str(tmp_path / "a-keys")


def test_the_local_fleet_demo_states_the_small_models_tenants_once() -> None:
    config = load_config(REPO / "deploy" / "local" / "fleet.yaml")

    assert [p.name for p in config.members_of("small")] == ["small-a", "small-b"]
    for pool in ("small-a", "small-b"):
        tenants = config.pool(pool).tenants
        assert [(t.name, t.floor_slots, t.preemptible) for t in tenants] == [
            ("A", 4, False),
            ("B", 4, True),
        ]
    assert config.pool("large").replica_group is None
