"""The local stack's helpers for tools that run a stack of their own: the settings that put
every service on a StackPorts (its free ports: tests/unit/slotshift_tools/bench/
test_stack_config.py), the config file the children read."""

from __future__ import annotations

from pathlib import Path

from slotshift.config import apply_overrides, load_config, parse_config
from slotshift.config.state_store import DEFAULT_SQLITE_NAME
from slotshift_tools.local_stack import (
    HOST,
    STREAM_TOKENS_FOLDER,
    StackPorts,
    StreamTokenFiles,
    _engine_key_settings,
    needs_stream_tokens,
    stream_tokens_folder,
    write_config,
)
from tests.support import TEST_TENANT_KEYS

CONFIG = parse_config(
    {
        "pools": [
            {
                "name": "p",
                "budget_slots": 8,
                "tenants": [{"name": "A", "api_keys": ["secret-key-a"]}],
            }
        ],
        "tenant_keys": TEST_TENANT_KEYS,
    }
)


def test_free_ports_are_all_different() -> None:
    ports = StackPorts.free(gateways=3)
    everything = [
        ports.engine,
        ports.controlplane,
        ports.controlplane_metrics,
        ports.agent_metrics,
        *ports.gateways,
    ]
    assert len(set(everything)) == 7
    assert all(port > 0 for port in everything)


def test_the_settings_put_every_service_on_the_ports() -> None:
    ports = StackPorts(8000, 50051, 9100, 9101, (8080, 8081))
    config = apply_overrides(CONFIG, ports.settings(CONFIG))
    assert ports.engine_url == config.pools[0].engine_url == f"http://{HOST}:8000"
    assert ports.gateway_url(1) == f"http://{HOST}:8081"
    assert (config.engine_sim.host, config.engine_sim.port) == (HOST, 8000)
    assert (config.controlplane.grpc_host, config.controlplane.grpc_port) == (HOST, 50051)
    assert config.controlplane.metrics_port == 9100
    assert config.gateway.controlplane_target == config.agent.controlplane_target == f"{HOST}:50051"
    assert config.gateway.pool == config.agent.pool == "p"
    assert config.agent.engine_metrics_url == f"http://{HOST}:8000/metrics"
    assert (config.agent.host, config.agent.metrics_port) == (HOST, 9101)
    assert config.local_stack.gateway_ports == [8080, 8081]


def test_a_written_config_reads_back_with_its_secrets(tmp_path: Path) -> None:
    path = tmp_path / "run" / "slotshift.yaml"
    write_config(path, CONFIG)
    loaded = load_config(path)
    # Loaded from a file, the state store's file is the one beside it (slotshift/config/loading.py).
    store = loaded.controlplane.state_store
    assert store.sqlite_file == str(path.parent / DEFAULT_SQLITE_NAME)
    unset = store.model_copy(update={"sqlite_file": None})
    controlplane = loaded.controlplane.model_copy(update={"state_store": unset})
    assert loaded.model_copy(update={"controlplane": controlplane}) == CONFIG
    assert "secret-key-a" in path.read_text()


def test_a_written_document_keeps_its_header(tmp_path: Path) -> None:
    path = tmp_path / "slotshift.yaml"
    write_config(path, {"pools": []}, header="# generated\n")
    assert path.read_text() == "# generated\npools: []\n"


def test_an_emulator_the_stack_starts_requires_the_key_its_pool_sends() -> None:
    keyed = CONFIG.pools[0].model_copy(update={"engine_api_key_file": "/run/engine-key"})
    assert _engine_key_settings(keyed, None) == ["engine_sim.api_key_file=/run/engine-key"]
    # The emulator's own key file, where set, says which keys it takes.
    assert _engine_key_settings(keyed, "/run/other-keys") == []
    assert _engine_key_settings(CONFIG.pools[0], None) == []


def test_a_stack_without_stream_credentials_generates_tokens_once(tmp_path: Path) -> None:
    files = StreamTokenFiles.ensure(tmp_path / "tokens")
    gateway, agent = files.gateway.read_text(), files.agent.read_text()
    assert gateway.strip() and agent.strip() and gateway != agent
    assert files.gateway.stat().st_mode & 0o777 == 0o600
    # Started again, the stack keeps its tokens (a restarted child still matches the others).
    again = StreamTokenFiles.ensure(tmp_path / "tokens")
    assert (again.gateway.read_text(), again.agent.read_text()) == (gateway, agent)
    # Another stack gets tokens of its own.
    other = StreamTokenFiles.ensure(tmp_path / "other")
    assert other.gateway.read_text() != gateway

    config = CONFIG
    assert needs_stream_tokens(config)
    secured = apply_overrides(config, files.settings())
    assert not needs_stream_tokens(secured)
    auth = secured.controlplane.stream_auth
    assert auth.gateway_token_file == secured.gateway.controlplane_token_file == str(files.gateway)
    assert auth.agent_token_file == secured.agent.controlplane_token_file == str(files.agent)
    insecure = apply_overrides(
        config, {"controlplane.stream_auth.insecure_allow_unauthenticated": True}
    )
    assert not needs_stream_tokens(insecure)


def test_the_generated_tokens_live_beside_the_stacks_state(tmp_path: Path) -> None:
    config_file = tmp_path / "conf" / "slotshift.yaml"
    write_config(config_file, CONFIG)
    loaded = load_config(config_file)
    assert stream_tokens_folder(loaded, config_file) == config_file.parent / STREAM_TOKENS_FOLDER
    elsewhere = apply_overrides(
        loaded, {"controlplane.state_store.sqlite_file": str(tmp_path / "state" / "s.sqlite3")}
    )
    assert stream_tokens_folder(elsewhere, config_file) == tmp_path / "state" / STREAM_TOKENS_FOLDER
