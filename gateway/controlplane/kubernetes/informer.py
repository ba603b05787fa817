"""List, then watch, one kind: the API conventions' informer loop, with its cache kept sans-IO.

:class:`ObjectCache` holds the objects of one kind by namespace and name and the resourceVersion
they are current at; it changes only through :meth:`ObjectCache.replace` (a list) and
:meth:`ObjectCache.apply` (a watch event), each of which says whether anything kvgate reads changed.

:func:`follow` drives it: list, then watch from the list's resourceVersion with bookmarks (which
move the version on while nothing changes, so a resumed watch starts near the present); when the
server ends a watch (its timeout, a restart, a load balancer) it watches again from the last
version seen, without listing; on 410 Gone (the version fell out of the server's history) it lists
again, which also notices objects deleted while no watch was open; other failures back off (0.2 s
doubling to 10 s) and retry. A kind the server does not serve (its CRD not installed: 404) is
retried at the slowest back-off and counts as empty meanwhile.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kvgate.gateway.controlplane.kubernetes.client import ApiError, Expired, KindSpec, KubeClient

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
_VOLATILE = ("resourceVersion", "managedFields")
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


CONFIG_MAP_KEY = "ca.crt"
"""The one key kvgate reads of a ConfigMap (a BackendTLSPolicy's CA certificates)."""


def _stable(obj: Mapping[str, Any]) -> JsonDict:
    """``obj`` without what changes on every write (resourceVersion, managedFields) and, but for a
    Pod's (its readiness and IP), without its status: kvgate writes the others' status itself, and
    reads none of it. Of a ConfigMap only its name and its ``ca.crt`` are kept: every ConfigMap is
    followed (a BackendTLSPolicy may name any), and the rest (other controllers' state, a leader
    election's annotation rewritten every few seconds) is neither held nor a change."""
    if obj.get("kind") == "ConfigMap":
        meta = obj.get("metadata", {})
        data = obj.get("data") or {}
        kept = {key: meta[key] for key in ("name", "namespace") if key in meta}
        has_ca = isinstance(data, Mapping) and CONFIG_MAP_KEY in data
        found = {CONFIG_MAP_KEY: data[CONFIG_MAP_KEY]} if has_ca else {}
        return {"apiVersion": obj.get("apiVersion", "v1"), "kind": "ConfigMap", "metadata": kept,
                "data": found}
    stable = copy.deepcopy(dict(obj))
    meta = stable.get("metadata", {})
    for name in _VOLATILE:
        meta.pop(name, None)
    if stable.get("kind") != "Pod":
        stable.pop("status", None)
    return stable


class ObjectCache:
    def __init__(self, spec: KindSpec) -> None:
        self.spec = spec
        self._objects: dict[tuple[str, str], JsonDict] = {}
        self.resource_version = ""
        self.synced = False
        """True once a list succeeded (the kind's objects are known)."""
        self.missing = False
        """The server does not serve this kind (404: its CRD is not installed)."""

    def objects(self) -> list[JsonDict]:
        return [self._objects[key] for key in sorted(self._objects)]

    def replace(self, items: list[JsonDict], resource_version: str) -> bool:
        typed = {"apiVersion": self.spec.api_version, "kind": self.spec.kind}
        fresh = {_key(item): _stable({**typed, **item}) for item in items}
        changed = fresh != self._objects or not self.synced
        self._objects = fresh
        self.resource_version = resource_version
        self.synced = True
        return changed

    def apply(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("type")
        obj = event.get("object", {})
        version = obj.get("metadata", {}).get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            return False
        key = _key(obj)
        if kind == "DELETED":
            return self._objects.pop(key, None) is not None
        if kind in ("ADDED", "MODIFIED"):
            stable = _stable({"apiVersion": self.spec.api_version, "kind": self.spec.kind, **obj})
            if self._objects.get(key) == stable:
                return False
            self._objects[key] = stable
            return True
        return False

    def expire(self) -> None:
        """The resourceVersion is gone from the server's history: list again before watching."""
        self.resource_version = ""


async def follow(
    client: KubeClient,
    cache: ObjectCache,
    namespace: str | None,
    on_change: Callable[[], None],
    stop: asyncio.Event,
    *,
    watch_timeout_s: int = 300,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> None:
    """Keep ``cache`` current until ``stop`` is set; ``on_change()`` after each change."""
    failures = 0
    while not stop.is_set():
        try:
            if not cache.resource_version:
                items, version = await client.list(cache.spec, namespace)
                if cache.replace(items, version):
                    on_change()
            async for event in client.watch(cache.spec, namespace, cache.resource_version,
                                            timeout_s=watch_timeout_s):
                if cache.apply(event):
                    on_change()
                failures = 0
                if stop.is_set():
                    return
            failures = 0
        except Expired:
            log.info("%s: resourceVersion %s expired; listing again", cache.spec.plural,
                     cache.resource_version)
            cache.expire()
        except ApiError as exc:
            failures += 1
            missing = exc.status == 404
            cache.missing = missing
            if missing and not cache.synced and cache.replace([], ""):
                on_change()  # known now: none (its CRD is not installed)
            delay = BACKOFF_MAX_S if missing else min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** (failures - 1))
            log.warning("%s: %s; retrying in %.1f s", cache.spec.plural, exc, delay)
            cache.expire()
            await _sleep_until(stop, delay, sleep)


async def _sleep_until(stop: asyncio.Event, delay: float, sleep: Callable[[float], Any]) -> None:
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, asyncio.ensure_future(sleep(delay))}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
