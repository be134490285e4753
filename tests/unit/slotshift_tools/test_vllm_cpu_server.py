"""The CPU vLLM server's command line: what slotshift's resume needs from vLLM is asked for."""

from __future__ import annotations

from pathlib import Path

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
