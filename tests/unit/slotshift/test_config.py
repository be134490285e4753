"""The shared config model: validation on load, key files, overrides, file paths and secrets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from slotshift.config import (
    ConfigError,
    apply_overrides,
    load_config,
    parse_config,
    parse_overrides,
    read_secret_text,
    revealed,
    with_resolved_paths,
)
from tests.support import TEST_TENANT_KEYS


def _document(**pool_fields: Any) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "name": "default",
        "budget_slots": 96,
        "tenants": [
            {"name": "A", "api_keys": ["key-a"], "floor_slots": 4},
            {"name": "B", "api_keys": ["key-b"], "floor_slots": 4},
        ],
    }
    pool.update(pool_fields)
    return {"pools": [pool]}


def _write(folder: Path, document: dict[str, Any], name: str = "slotshift.yaml") -> Path:
    """`document` as a config file (with the tests' key-digest secret unless it says otherwise)."""
    path = folder / name
    path.write_text(yaml.safe_dump({"tenant_keys": TEST_TENANT_KEYS, **document}))
    return path


def _keys(config_path: Path, tenant: str) -> list[str]:
    pool = load_config(config_path).pool("default")
    (found,) = (t for t in pool.tenants if t.name == tenant)
    return [key.get_secret_value() for key in found.api_keys]


def test_the_local_demo_config_loads() -> None:
    config = load_config(Path(__file__).parents[3] / "deploy" / "local" / "slotshift.yaml")

    assert config.pool("default").budget_slots == 96
    assert [t.name for t in config.pool("default").tenants] == ["A", "B"]


def test_floors_above_the_budget_are_rejected_with_the_field_named() -> None:
    document = _document(budget_slots=6)

    with pytest.raises(ConfigError, match=r"pools\.0: .*floor_slots sum to 8, above budget_slots"):
        parse_config(document)


def test_ceilings_below_the_budget_are_rejected() -> None:
    document = _document()
    for tenant in document["pools"][0]["tenants"]:
        tenant["ceiling_slots"] = 40

    with pytest.raises(ConfigError, match=r"ceiling_slots sum to 80, below budget_slots \(96\)"):
        parse_config(document)


def test_a_floor_above_its_own_ceiling_is_rejected() -> None:
    document = _document()
    document["pools"][0]["tenants"][0].update(floor_slots=10, ceiling_slots=5)

    with pytest.raises(ConfigError, match=r"pools\.0\.tenants\.0: .*floor_slots \(10\) is above"):
        parse_config(document)


def test_duplicate_tenants_are_rejected() -> None:
    document = _document()
    document["pools"][0]["tenants"][1]["name"] = "A"

    with pytest.raises(ConfigError, match=r"tenant names repeat: \['A'\]"):
        parse_config(document)


def test_an_unknown_field_is_rejected_with_its_path() -> None:
    document = _document()
    document["gateway"] = {"prot": 8080}

    with pytest.raises(ConfigError, match=r"gateway\.prot: Extra inputs are not permitted"):
        parse_config(document)


def test_overrides_change_one_field_and_keep_the_secrets() -> None:
    config = parse_config(_document())

    changed = apply_overrides(config, {"gateway.port": 8081, "controlplane.grpc_host": "0.0.0.0"})

    assert changed.gateway.port == 8081
    assert changed.controlplane.grpc_host == "0.0.0.0"
    assert config.gateway.port == 8080
    keys = [k.get_secret_value() for t in changed.pool("default").tenants for k in t.api_keys]
    assert keys == ["key-a", "key-b"]


def test_overrides_are_validated_again() -> None:
    config = parse_config(_document())

    with pytest.raises(ConfigError, match=r"gateway\.port"):
        apply_overrides(config, {"gateway.port": 70000})


@pytest.mark.parametrize(
    ("dotted", "unknown"),
    [
        pytest.param("gateway.prot", "prot", id="unknown-field"),
        pytest.param("gatway.port", "gatway", id="unknown-section"),
        pytest.param("gateway.port.number", "number", id="below-a-leaf"),
    ],
)
def test_an_unknown_override_path_is_rejected(dotted: str, unknown: str) -> None:
    config = parse_config(_document())

    with pytest.raises(ConfigError, match=rf"override {re.escape(dotted)}: no .*'{unknown}'"):
        apply_overrides(config, {dotted: 1})


def test_keys_from_a_file_are_added_to_the_inline_keys(tmp_path: Path) -> None:
    (tmp_path / "a.keys").write_text("# tenant A\nkey-a-2\n\n  key-a-3  \n#key-a-disabled\n")
    document = _document()
    document["pools"][0]["tenants"][0]["api_keys_file"] = "a.keys"

    keys = _keys(_write(tmp_path, document), "A")

    assert keys == ["key-a", "key-a-2", "key-a-3"]


def test_a_key_file_is_read_relative_to_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf" / "secrets").mkdir(parents=True)
    (tmp_path / "conf" / "secrets" / "b").write_text("key-b-2\n")
    document = _document()
    document["pools"][0]["tenants"][1]["api_keys_file"] = "secrets/b"
    config_path = _write(tmp_path / "conf", document)
    monkeypatch.chdir(tmp_path)

    assert _keys(Path("conf/slotshift.yaml"), "B") == ["key-b", "key-b-2"]
    assert _keys(config_path, "B") == ["key-b", "key-b-2"]


def test_an_absolute_key_file_path_is_used_as_it_is(tmp_path: Path) -> None:
    key_file = tmp_path / "elsewhere" / "b"
    key_file.parent.mkdir()
    key_file.write_text("key-b-2\n")
    document = _document()
    document["pools"][0]["tenants"][1].update(api_keys=[], api_keys_file=str(key_file))
    (tmp_path / "conf").mkdir()

    assert _keys(_write(tmp_path / "conf", document), "B") == ["key-b-2"]


def test_a_loaded_config_names_its_key_file_absolutely_and_survives_overrides(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.keys").write_text("key-a-2\n")
    document = _document()
    document["pools"][0]["tenants"][0]["api_keys_file"] = "a.keys"
    config = load_config(_write(tmp_path, document))

    changed = apply_overrides(config, {"gateway.port": 8081})

    tenant = changed.pool("default").tenants[0]
    assert tenant.api_keys_file == str(tmp_path / "a.keys")
    assert [k.get_secret_value() for k in tenant.api_keys] == ["key-a", "key-a-2"]


def test_a_missing_key_file_names_the_tenant_and_the_path(tmp_path: Path) -> None:
    document = _document()
    document["pools"][0]["tenants"][1]["api_keys_file"] = "missing.keys"
    config_path = _write(tmp_path, document)

    with pytest.raises(ConfigError) as caught:
        load_config(config_path)

    message = str(caught.value)
    assert "tenant 'B' of pool 'default'" in message
    assert str(tmp_path / "missing.keys") in message


def test_an_unreadable_key_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "a.keys").mkdir()  # a folder where a file should be: reading it fails
    document = _document()
    document["pools"][0]["tenants"][0]["api_keys_file"] = "a.keys"

    with pytest.raises(ConfigError, match=r"tenant 'A' .*api_keys_file: cannot read"):
        load_config(_write(tmp_path, document))


def test_a_key_file_that_is_not_text_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "a.keys").write_bytes(b"\xff\xfe\x00key")
    document = _document()
    document["pools"][0]["tenants"][0]["api_keys_file"] = "a.keys"

    with pytest.raises(ConfigError, match=r"tenant 'A' .*api_keys_file: cannot read"):
        load_config(_write(tmp_path, document))


def test_every_file_field_is_made_absolute_relative_to_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "a.keys").write_text("key-file\n")
    document = _document(engine_tls={"ca_file": "ca.pem"})
    document["pools"][0]["tenants"][0]["api_keys_file"] = "a.keys"
    document["controlplane"] = {
        "admin_token_file": "/run/secrets/token",
        "tls": {"cert_file": "cp.pem", "key_file": "cp.key"},
    }
    document["gateway"] = {"controlplane_tls": {"ca_file": "sub/ca.pem"}}

    config = load_config(_write(tmp_path, document))

    pool = config.pool("default")
    assert config.controlplane.tls is not None
    assert config.gateway.controlplane_tls is not None
    assert pool.engine_tls is not None
    assert pool.tenants[0].api_keys_file == str(tmp_path / "a.keys")
    assert config.controlplane.admin_token_file == "/run/secrets/token"
    assert config.controlplane.tls.cert_file == str(tmp_path / "cp.pem")
    assert config.controlplane.tls.key_file == str(tmp_path / "cp.key")
    assert config.gateway.controlplane_tls.ca_file == str(tmp_path / "sub" / "ca.pem")
    assert pool.engine_tls.ca_file == str(tmp_path / "ca.pem")
    assert pool.engine_tls.cert_file is None


def test_a_config_without_paths_is_returned_as_it_is() -> None:
    config = parse_config(_document())

    assert with_resolved_paths(config, Path("/elsewhere")) is config


def test_revealed_puts_every_secret_in_clear_without_changing_the_dump() -> None:
    dump = {"a": SecretStr("x"), "b": [SecretStr("y"), {"c": SecretStr("z")}], "d": 1}

    assert revealed(dump) == {"a": "x", "b": ["y", {"c": "z"}], "d": 1}
    assert isinstance(dump["a"], SecretStr)


def test_an_unreadable_secret_file_names_the_field_and_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "token"

    with pytest.raises(ConfigError, match=rf"^admin: cannot read {re.escape(str(missing))}: "):
        read_secret_text(str(missing), field="admin")


def test_set_flags_become_overrides_with_yaml_values() -> None:
    assert parse_overrides(["gateway.port=8081", "pools.0.policy = slo", "x.y=null"]) == {
        "gateway.port": 8081,
        "pools.0.policy": "slo",
        "x.y": None,
    }
    with pytest.raises(ConfigError, match=r"expected SECTION\.FIELD=VALUE"):
        parse_overrides(["gateway.port"])


def _fleet(**gateway: Any) -> dict[str, Any]:
    """Two pools serving two models; tenant A in both, B in the first."""
    return {
        "pools": [
            {
                "name": "llama",
                "models": ["llama-3b", "llama"],
                "budget_slots": 8,
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"]},
                    {"name": "B", "api_keys": ["key-b"]},
                ],
            },
            {
                "name": "qwen",
                "models": ["qwen-7b"],
                "budget_slots": 4,
                "tenants": [{"name": "A", "api_keys": ["key-a"]}],
            },
        ],
        "gateway": gateway or {"pools": ["llama", "qwen"]},
    }


def test_a_gateway_fronts_the_pools_it_names() -> None:
    config = parse_config(_fleet())
    assert [p.name for p in config.fronted_pools()] == ["llama", "qwen"]
    single = parse_config(_fleet(pool="qwen"))
    assert [p.name for p in single.fronted_pools()] == ["qwen"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(
            lambda d: d["pools"][1]["tenants"][0].update(api_keys=["other-key"]),
            r"tenant A: its api_keys .* in pool qwen differ from those in pool llama",
            id="a-tenant-with-two-key-sets",
        ),
        pytest.param(
            lambda d: d["pools"][1]["tenants"].append({"name": "C", "api_keys": ["key-b"]}),
            r"tenants B and C share an API key",
            id="a-key-for-two-tenants-across-pools",
        ),
        pytest.param(
            lambda d: d["gateway"].update(pools=["llama", "mistral"]),
            r"gateway.pools: no pool named 'mistral'",
            id="an-unknown-pool",
        ),
        pytest.param(
            lambda d: d["gateway"].update(pools=["llama", "llama"]),
            r"gateway.pools repeat",
            id="a-pool-twice",
        ),
        pytest.param(
            lambda d: d["pools"][1].update(models=[]),
            r"pools \['qwen'\] name no models",
            id="several-pools-one-without-models",
        ),
        pytest.param(
            lambda d: d["pools"][0].update(models=["llama", "llama"]),
            r"models repeat: \['llama'\]",
            id="a-model-twice",
        ),
    ],
)
def test_a_fleet_that_cannot_route_is_refused(change: Any, problem: str) -> None:
    document = _fleet()
    change(document)
    with pytest.raises(ConfigError, match=problem):
        parse_config(document)


def test_model_names_are_as_clients_send_them() -> None:
    document = _fleet()
    document["pools"][0]["models"] = ["Qwen/Qwen2.5-3B-Instruct", "qwen"]
    assert parse_config(document).pools[0].models == ["Qwen/Qwen2.5-3B-Instruct", "qwen"]
    document["pools"][0]["models"] = ["with space"]
    with pytest.raises(ConfigError, match=r"pools\.0\.models\.0"):
        parse_config(document)
