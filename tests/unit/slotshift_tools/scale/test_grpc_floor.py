"""The gRPC floor measurement runs end to end: a real echo server process, real streams."""

from __future__ import annotations

import re

import pytest

from slotshift_tools.scale.grpc_floor import main


def test_it_measures_the_servers_cpu_per_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--streams", "2", "--rate-per-s", "50", "--duration-s", "0.5"]) == 0
    line = capsys.readouterr().out.strip()
    found = re.fullmatch(
        r"(\d+) messages \(\d+/s\) on 2 streams: server ([\d.]+) of a core, ([\d.]+) µs .*", line
    )
    assert found is not None, line
    assert int(found.group(1)) >= 20, "both streams sent and got their echoes"
    assert float(found.group(3)) > 0
