"""The CPU vLLM server's command line: what slotshift's resume needs from vLLM is asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotshift.config import ConfigError
from slotshift_tools.vllm_cpu.environment import VllmCpuPaths
from slotshift_tools.vllm_cpu.server import VllmServer, VllmServerSettings


def _command(**settings: object) -> list[str]:
    server = VllmServer(
        VllmCpuPaths(Path("/checkout")),
        Path("/checkout/.cache/vllm-cpu-model"),
        VllmServerSettings(port=8123, **settings),  # type: ignore[arg-type]
    )
    return server.command()


def _value(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, command
    return command[command.index(flag) + 1]


def test_blocks_are_small_enough_for_a_continuation_to_hit_the_prefix_cache() -> None:
    command = _command()
    # vLLM's CPU build would choose 128-token blocks, and its prefix cache hits whole blocks
    # only; its CPU attention backend takes multiples of 32.
    block = int(_value(command, "--block-size"))
    assert block == 32
    assert "--enable-prefix-caching" in command
    assert "--no-enable-prefix-caching" not in command


def test_usage_reports_cached_prompt_tokens() -> None:
    # The gateway's waste counter reads usage.prompt_tokens_details.cached_tokens.
    assert "--enable-prompt-tokens-details" in _command()


def test_the_block_size_is_a_setting_and_extra_args_come_last() -> None:
    command = _command(block_size_tokens=64, extra_args=("--seed", "3"))
    assert _value(command, "--block-size") == "64"
    assert command[-2:] == ["--seed", "3"]
    assert _value(command, "--port") == "8123"
    assert _value(command, "--max-num-seqs") == "64"


def test_aliases_follow_the_served_model_name() -> None:
    command = _command(served_model_name="org/model", served_model_aliases=("model", "m"))
    at = command.index("--served-model-name")
    assert command[at + 1 : at + 4] == ["org/model", "model", "m"]
    assert command[at + 4].startswith("--")


def _environment(tmp_path: Path, key: str | None, base: dict[str, str]) -> dict[str, str]:
    key_file = None
    if key is not None:
        key_file = tmp_path / "engine-api-key"
        key_file.write_text(f"# the engine's key\n{key}\n")
    server = VllmServer(
        VllmCpuPaths(Path("/checkout")),
        Path("/checkout/.cache/vllm-cpu-model"),
        VllmServerSettings(port=8123, api_key_file=key_file),
    )
    return server.environment(base)


def test_the_api_key_goes_to_vllm_in_its_environment_not_on_the_command_line(
    tmp_path: Path,
) -> None:
    env = _environment(tmp_path, "sk-cpu-vllm-key", {"PATH": "/usr/bin"})
    # vLLM takes VLLM_API_KEY when --api-key is absent; the command line is for `ps` to show.
    assert env["VLLM_API_KEY"] == "sk-cpu-vllm-key"
    assert "--api-key" not in _command()


def test_without_a_key_file_no_key_is_passed_on_whatever_the_callers_environment(
    tmp_path: Path,
) -> None:
    env = _environment(tmp_path, None, {"PATH": "/usr/bin", "VLLM_API_KEY": "leaked"})
    assert "VLLM_API_KEY" not in env


def test_a_key_file_without_a_key_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "engine-api-key"
    key_file.write_text("\n")
    server = VllmServer(
        VllmCpuPaths(Path("/checkout")),
        Path("/checkout/.cache/vllm-cpu-model"),
        VllmServerSettings(port=8123, api_key_file=key_file),
    )
    with pytest.raises(ConfigError, match="holds no token"):
        server.environment({})
