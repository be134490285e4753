"""admission_gateway/routing.py: a request goes to a pool that serves its model, among those its
tenant may use, where the tenant has the most room."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission_gateway.routing import ModelNotFound, ModelRequired, route, tenant_models


@dataclass
class _Front:
    name: str
    models: tuple[str, ...]
    rooms: dict[str, tuple[int, int]] = field(default_factory=dict)
    available: bool = True

    def room(self, tenant: str) -> tuple[int, int] | None:
        return self.rooms.get(tenant)


def test_a_request_goes_to_the_pool_of_its_model() -> None:
    fronts = [
        _Front("llama", ("llama-3b",), {"A": (4, 0), "B": (4, 0)}),
        _Front("qwen", ("qwen-7b", "qwen"), {"A": (1, 0)}),
    ]
    assert route(fronts, "A", "qwen").pool == "qwen"
    assert route(fronts, "A", "llama-3b").pool == "llama"
    assert tenant_models(fronts, "A") == ["llama-3b", "qwen-7b", "qwen"]
    assert tenant_models(fronts, "B") == ["llama-3b"]


def test_unknown_and_forbidden_models_are_not_found_alike() -> None:
    fronts = [_Front("llama", ("llama-3b",), {"A": (4, 0)}), _Front("qwen", ("qwen",), {})]
    with pytest.raises(ModelNotFound):
        route(fronts, "A", "gpt-4")
    with pytest.raises(ModelNotFound):
        route(fronts, "A", "qwen")  # exists, but A is no tenant of it


def test_no_model_is_the_tenants_only_model_or_a_refusal() -> None:
    fronts = [
        _Front("llama", ("llama-3b",), {"A": (4, 0), "B": (4, 0)}),
        _Front("qwen", ("qwen",), {"A": (1, 0)}),
    ]
    assert route(fronts, "B", None) == route(fronts, "B", "llama-3b")
    assert route(fronts, "B", None).model == "llama-3b"
    with pytest.raises(ModelRequired) as refused:
        route(fronts, "A", None)
    assert refused.value.models == ("llama-3b", "qwen")
    aliases = [_Front("llama", ("llama-3b", "llama"), {"A": (1, 0)})]
    assert route(aliases, "A", None).model == "llama-3b", "aliases are one model"
    replicas = [_Front("r1", ("m", "m1"), {"A": (1, 0)}), _Front("r2", ("m",), {"A": (2, 0)})]
    assert route(replicas, "A", None).pool == "r2", "one model on two replicas"
    alone = [_Front("any", (), {"A": (1, 0)})]
    assert route(alone, "A", None).pool == "any"
    assert route(alone, "A", "whatever").pool == "any", "a pool naming no model serves any"


def test_replicas_by_room_then_fewest_in_flight_then_config_order() -> None:
    one = _Front("one", ("m",), {"A": (2, 5)})
    two = _Front("two", ("m",), {"A": (3, 9)})
    assert route([one, two], "A", "m").pool == "two", "the most room"
    two.rooms["A"] = (2, 4)
    assert route([one, two], "A", "m").pool == "two", "tie: the fewest in flight"
    two.rooms["A"] = (2, 5)
    assert [route([one, two], "A", "m", turn).pool for turn in range(4)] == [
        "one",
        "two",
        "one",
        "two",
    ], "tied on both: they take turns"
    one.rooms["A"] = (-3, 8)
    assert route([one, two], "A", "m").pool == "two", "queued requests count against room"


def test_an_unreachable_replica_is_passed_over_while_another_serves_the_model() -> None:
    down = _Front("one", ("m",), {"A": (9, 0)}, available=False)
    up = _Front("two", ("m",), {"A": (1, 3)})
    assert route([down, up], "A", "m").pool == "two", "despite its room"
    up.available = False
    assert route([down, up], "A", "m").pool == "one", "none available: room decides again"


@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 5)), min_size=1, max_size=5))
@settings(max_examples=200, deadline=None)
def test_the_chosen_replica_has_the_most_room(rooms: list[tuple[int, int]]) -> None:
    fronts = [_Front(f"r{i}", ("m",), {"A": room}) for i, room in enumerate(rooms)]
    best = max(rooms, key=lambda r: (r[0], -r[1]))
    tied = [f.name for f, room in zip(fronts, rooms, strict=True) if room == best]
    chosen = [route(fronts, "A", "m", turn).pool for turn in range(len(tied))]
    assert chosen == tied, "each tied replica once per round, in config order"
