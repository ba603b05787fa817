"""The event loop a kvgate process runs on (``--loop``): uvloop by default, asyncio's own on request.

The picker's request path is mostly grpc.aio and asyncio handing each ext_proc message between
grpc's threads and the loop; uvloop does that hand-over and its callbacks in C: Envoy's calls to the
picker are shorter at concurrency 1 and the CPU per request under load is the same on either loop
(``bench/results/uvloop.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

CHOICES = ("auto", "uvloop", "asyncio")
DEFAULT = "auto"

T = TypeVar("T")


class LoopUnavailable(RuntimeError):
    """``--loop uvloop`` where uvloop is not installed."""


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for ``choice`` (None: asyncio's default loop). ``auto``: uvloop when it is
    installed (a dependency of kvgate; absent only where someone removed it), else asyncio's."""
    if choice not in CHOICES:
        raise ValueError(f"unknown event loop {choice!r}: one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise LoopUnavailable("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this coroutine runs on (the ready lines say it)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"


def run(main: Callable[[], Coroutine[Any, Any, T]], choice: str) -> T:
    """``asyncio.run(main())`` on the loop ``choice`` names (raises :class:`LoopUnavailable` before
    ``main`` is called)."""
    factory = loop_factory(choice)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def add_loop_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loop", choices=CHOICES, default=DEFAULT,
        help="event loop: auto (default) is uvloop when installed, else asyncio's own",
    )
