"""What each pool's ready replicas serve: their ``/v1/models``, polled off the request path.

A replica is ready when its metrics scrape succeeds (the picker's view). Each ready replica's
``GET /v1/models`` is fetched when it is first seen and then every ``interval`` seconds (a replica
loads and unloads LoRA adapters at run time); between polls the scraped metrics fill in (the base
model a page labels its gauges with, the adapters it runs), so a new adapter shows within a scrape.

Two readers, neither on the network: ``GET /v1/models`` through the gateway lists the latest
(:meth:`ReplicaModels.reports`), and the picker asks per request whether a name is one the pool's
replicas serve (:meth:`ReplicaModels.names`: a set kept per pool, so a request costs a lookup).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvgate.policies.types import EndpointSnapshot, EndpointView

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReportedModel:
    """One entry of a replica's ``/v1/models`` (its ``card``: the object as the replica sent it)."""

    id: str
    card: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolModels:
    """What a pool's ready replicas report: ``models`` merged over them (first seen wins)."""

    ready_replicas: int = 0
    models: tuple[ReportedModel, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolModelNames:
    """The names a pool's ready replicas serve, and whether every one of them has said (its
    ``/v1/models`` polled): only then can a name missing here be called unserved."""

    names: frozenset[str] = frozenset()
    complete: bool = False


def _parse(body: Any) -> tuple[ReportedModel, ...]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return ()
    return tuple(
        ReportedModel(item["id"], item)
        for item in data
        if isinstance(item, dict) and isinstance(item.get("id"), str)
    )


def _from_metrics(view: EndpointView) -> list[ReportedModel]:
    metrics = view.metrics
    if metrics is None:
        return []
    bases = sorted(metrics.served_models)
    parent = bases[0] if len(bases) == 1 else None
    found = [ReportedModel(name) for name in bases]
    found += [
        ReportedModel(name, {"parent": parent} if parent else {})
        for name in sorted(metrics.active_loras | metrics.waiting_loras)
    ]
    return found


def _ready(views: tuple[EndpointView, ...]) -> list[EndpointView]:
    return [view for view in views if view.healthy and view.metrics is not None]


def pool_models(
    snapshot: EndpointSnapshot, polled: Mapping[str, tuple[ReportedModel, ...]]
) -> dict[str, PoolModels]:
    """Each pool's ready replicas and the models they report (polled first, then scraped)."""
    out: dict[str, PoolModels] = {}
    for pool, views in snapshot.pools.items():
        ready = _ready(views)
        merged: dict[str, ReportedModel] = {}
        for view in ready:
            for model in polled.get(view.address, ()):
                merged.setdefault(model.id, model)
        for view in ready:
            for model in _from_metrics(view):
                merged.setdefault(model.id, model)
        out[pool] = PoolModels(len(ready), tuple(merged.values()))
    return out


def pool_model_names(
    snapshot: EndpointSnapshot, polled: Mapping[str, tuple[ReportedModel, ...]]
) -> dict[str, PoolModelNames]:
    """Each pool's served names (:func:`pool_models`' ids), complete when every ready replica was
    polled (a pool with no ready replica is never complete: nothing says what it will serve)."""
    return {pool: views_model_names(views, polled) for pool, views in snapshot.pools.items()}


def views_model_names(
    views: tuple[EndpointView, ...], polled: Mapping[str, tuple[ReportedModel, ...]]
) -> PoolModelNames:
    """One pool's :func:`pool_model_names`."""
    ready = _ready(views)
    names: set[str] = set()
    complete = bool(ready)
    for view in ready:
        reported = polled.get(view.address)
        if reported is None:
            complete = False
        else:
            names.update(model.id for model in reported)
        metrics = view.metrics
        if metrics is not None:
            names.update(metrics.served_models)
            names.update(metrics.active_loras)
            names.update(metrics.waiting_loras)
    return PoolModelNames(frozenset(names), complete)


NAMES_REFRESH_S = 0.1
"""A pool's names are computed again when a poll changed them, and otherwise at most this often
while its endpoints' views change (the scraper publishes a new tuple per scrape tick: at 1,000
endpoints about one a millisecond, and the names are O(pool)); a name not among them is checked
against the latest views before it is called unserved (``names(pool, fresh=True)``)."""


class ReplicaModels:
    """Polls the ready replicas' ``/v1/models`` (:meth:`start` / :meth:`stop`) and answers what they
    serve from the latest polls and the live snapshot."""

    def __init__(
        self, snapshot: Callable[[], EndpointSnapshot], *, interval: float = 5.0, timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        tls_of: Callable[[str], ssl.SSLContext | None] = lambda pool: None,
    ) -> None:
        """``tls_of``: a pool's client context where its model servers serve HTTPS."""
        self._snapshot = snapshot
        self._tls_of = tls_of
        self._clock = clock
        self._interval = interval
        self._timeout = timeout
        self._polled: dict[str, tuple[ReportedModel, ...]] = {}
        self._polled_at: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._names: dict[str, tuple[tuple[EndpointView, ...], int, float, PoolModelNames]] = {}
        """Per pool: the views and the polls' version its names were computed from, when, and them."""
        self._version = 0

    def reports(self) -> dict[str, PoolModels]:
        return pool_models(self._snapshot(), self._polled)

    def names(self, pool: str, fresh: bool = False) -> PoolModelNames:
        """What ``pool``'s ready replicas serve: computed again when a poll changed, and when the
        pool's views changed ``NAMES_REFRESH_S`` after the last time (at once with ``fresh``)."""
        views = self._snapshot().endpoints(pool)
        now = self._clock()
        cached = self._names.get(pool)
        if cached is not None and cached[1] == self._version and (
            cached[0] is views or (not fresh and 0.0 <= now - cached[2] < NAMES_REFRESH_S)
        ):
            return cached[3]
        names = views_model_names(views, self._polled)
        self._names[pool] = (views, self._version, now, names)
        if len(self._names) > 2 * len(self._snapshot().pools) + 16:  # pools removed since
            self._names = {pool: self._names[pool]}
        return names

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            await self.poll_due(time.monotonic())
            await asyncio.sleep(0.25)

    async def poll_due(self, now: float) -> None:
        """Poll every ready replica not polled in the last ``interval`` seconds; forget the gone."""
        views = [v for vs in self._snapshot().pools.values() for v in vs if v.healthy and v.metrics]
        present = {view.address: view.endpoint.pool for view in views}
        for gone in set(self._polled) - present.keys():
            self._polled.pop(gone, None)
            self._polled_at.pop(gone, None)
            self._version += 1
        due = [a for a in sorted(present) if now - self._polled_at.get(a, -1e18) >= self._interval]
        if due:
            tls_of = self._tls_of
            await asyncio.gather(*(self._poll(address, now, tls_of(present[address])) for address in due))

    async def _poll(self, address: str, now: float, tls: ssl.SSLContext | None) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))
        self._polled_at[address] = now
        url = f"{'http' if tls is None else 'https'}://{address}/v1/models"
        try:
            async with self._session.get(url, ssl=tls or True) as response:
                if response.status != 200:
                    return
                models = _parse(await response.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("GET %s failed: %s", url, exc)
            return
        if self._polled.get(address) != models:
            self._polled[address] = models
            self._version += 1
