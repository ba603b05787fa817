"""Every test here runs on asyncio's own loop and on uvloop, the picker's default (``--loop``): the
scraper's protocol once failed every GET on uvloop alone (its transport is not an asyncio.Transport)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
