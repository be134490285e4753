"""The CLI's choice of event loop for a service."""

from __future__ import annotations

import pytest
import uvloop

from slotshift_tools.cli import _loop_factory, build_parser


def test_services_run_on_uvloop_unless_asked_for_asyncios_own() -> None:
    factory = _loop_factory("uvloop")
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    assert _loop_factory("asyncio") is None


def test_the_event_loop_flag_takes_only_the_loops_it_knows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLOTSHIFT_EVENT_LOOP", raising=False)
    parser = build_parser()
    assert parser.parse_args(["gateway"]).event_loop == "uvloop"
    assert parser.parse_args(["gateway", "--event-loop", "asyncio"]).event_loop == "asyncio"
    with pytest.raises(SystemExit):
        parser.parse_args(["gateway", "--event-loop", "trio"])
