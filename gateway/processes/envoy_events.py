"""Say what goes wrong in Envoy, from its own counters: one log line per kind of event and interval.

Envoy counts its failures (requests answered 5xx, ext_proc streams to the picker that failed,
header mutations it refused, endpoints its outlier detection ejected, connections to the picker that
failed) but logs none of them at its default level, so a running gateway stayed silent while they
happened. :class:`EnvoyEvents` reads the admin's ``/stats`` every ``interval`` seconds and logs a
warning for each counter that grew, with the increase: rate-limited by construction (one line per
kind per interval), and nothing on the request path. A counter that went down (Envoy restarted)
starts over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Watched:
    pattern: re.Pattern[str]
    """Counter names (several listeners or clusters add up, per captured group)."""
    message: str
    """The warning, formatted with ``count``, ``interval`` and ``group`` (the captured name part)."""


WATCHED = (
    Watched(re.compile(r"^http\.(?!admin\.)[^.]+\.downstream_rq_5xx$"),
            "{count} requests answered 5xx in the last {interval:g} s"),
    Watched(re.compile(r"^http\.[^.]+\.ext_proc\.streams_failed$"),
            "{count} requests could not be processed by the endpoint picker (ext_proc streams failed)"),
    Watched(re.compile(r"^http\.[^.]+\.ext_proc\.rejected_header_mutations$"),
            "{count} header mutations of the endpoint picker refused by Envoy"),
    Watched(re.compile(r"^http\.[^.]+\.ext_proc\.message_timeouts$"),
            "{count} endpoint picker replies timed out"),
    Watched(re.compile(r"^cluster\.(kvgate_ext_proc|kvgate_outcomes)\.upstream_cx_connect_fail$"),
            "{count} connections to {group} failed"),
    Watched(re.compile(r"^cluster\.(kvgate_pool_[^.]+)\.outlier_detection\.ejections_enforced_total$"),
            "Envoy ejected an endpoint of {group} {count} times (consecutive 5xx)"),
    Watched(re.compile(r"^cluster\.(kvgate_pool_[^.]+)\.upstream_cx_connect_fail$"),
            "{count} connections to endpoints of {group} failed"),
    Watched(re.compile(r"^listener\..+\.downstream_global_cx_overflow$"),
            "{count} client connections refused: the gateway's connection limit is reached"),
)


def totals(stats: Mapping[str, int]) -> dict[tuple[int, str], int]:
    """Each watched counter's total, by (index in :data:`WATCHED`, captured group)."""
    found: dict[tuple[int, str], int] = {}
    for name, value in stats.items():
        for index, watched in enumerate(WATCHED):
            match = watched.pattern.match(name)
            if match is not None:
                key = (index, match.group(1) if match.groups() else "")
                found[key] = found.get(key, 0) + value
    return found


def events(before: Mapping[tuple[int, str], int], after: Mapping[tuple[int, str], int],
           interval: float) -> list[str]:
    """The warnings for what grew from ``before`` to ``after`` (a counter that went down: Envoy
    started over, so its whole value is new)."""
    lines = []
    for key, value in sorted(after.items()):
        previous = before.get(key, 0)
        grown = value - previous if value >= previous else value
        if grown > 0:
            index, group = key
            lines.append(WATCHED[index].message.format(count=grown, interval=interval, group=group))
    return lines


class EnvoyEvents:
    """Polls ``admin_url``'s counters every ``interval`` seconds and logs what grew."""

    def __init__(self, admin_url: str, *, interval: float = 5.0) -> None:
        self._admin_url = admin_url
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._last: dict[tuple[int, str], int] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.poll(session)
                await asyncio.sleep(self._interval)

    async def poll(self, session: aiohttp.ClientSession) -> list[str]:
        """One look at the counters; the warnings logged (none the first time: a baseline)."""
        try:
            async with session.get(f"{self._admin_url}/stats?format=json&usedonly") as response:
                document = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return []  # Envoy restarting: the supervisor says so
        stats = {item["name"]: item["value"] for item in document.get("stats", [])
                 if isinstance(item, dict) and isinstance(item.get("value"), int)}
        now = totals(stats)
        lines = [] if self._last is None else events(self._last, now, self._interval)
        self._last = now
        for line in lines:
            log.warning("%s", line)
        return lines
