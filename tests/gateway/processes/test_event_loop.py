"""``--loop``: which event loop a kvgate process runs on."""

from __future__ import annotations

import argparse
import asyncio
import sys

import pytest
import uvloop

from kvgate.gateway.processes import event_loop


def test_auto_and_uvloop_run_uvloop_and_asyncio_its_own() -> None:
    async def name() -> str:
        return event_loop.running_loop_name()

    assert event_loop.run(name, "auto") == "uvloop"
    assert event_loop.run(name, "uvloop") == "uvloop"
    assert event_loop.run(name, "asyncio") == "asyncio"
    assert event_loop.loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop.loop_factory("asyncio") is None


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import of it now fails, as when absent
    assert event_loop.loop_factory("auto") is None
    started: list[str] = []

    async def main() -> None:
        started.append("main")

    with pytest.raises(event_loop.LoopUnavailable, match="uvloop is not installed"):
        event_loop.run(main, "uvloop")
    assert started == []  # refused before the coroutine was made: nothing left un-awaited


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event loop"):
        event_loop.loop_factory("trio")


def test_the_flag_defaults_to_auto() -> None:
    parser = argparse.ArgumentParser()
    event_loop.add_loop_argument(parser)
    assert parser.parse_args([]).loop == "auto"
    assert parser.parse_args(["--loop", "asyncio"]).loop == "asyncio"
    with pytest.raises(SystemExit):
        parser.parse_args(["--loop", "trio"])


def test_the_running_loop_is_named_inside_a_plain_asyncio_run() -> None:
    assert asyncio.run(_name()) == "asyncio"


async def _name() -> str:
    return event_loop.running_loop_name()
