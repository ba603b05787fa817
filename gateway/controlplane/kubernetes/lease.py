"""Leader election with a coordination.k8s.io/v1 Lease: with several kvgate replicas, all serve
traffic and follow the cluster, and the one holding the Lease writes status.

The usual protocol (client-go's leaderelection): every ``retry_s`` each replica reads the Lease; the
holder renews it (``renewTime``); another replica takes it over once ``renewTime`` is older than
``leaseDurationSeconds``, counting ``leaseTransitions``. Every write is a replace carrying the
resourceVersion read, so two replicas taking over at once cannot both succeed (409 Conflict for the
loser). A holder that cannot renew for a whole lease duration stops acting as leader by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kvgate.gateway.controlplane.kubernetes.client import ApiError, KindSpec, KubeClient

log = logging.getLogger(__name__)

LEASE = KindSpec("coordination.k8s.io/v1", "Lease", "leases")
JsonDict = dict[str, Any]


def _micro_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    for layout in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, layout).replace(tzinfo=UTC).timestamp()
    return 0.0


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        *,
        name: str = "kvgate-status-writer",
        identity: str | None = None,
        lease_duration_s: float = 15.0,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self._duration = lease_duration_s
        self._retry = retry_s
        self._clock = clock
        self._renewed_at = 0.0
        self._leader = False
        self.changed = asyncio.Event()
        """Set whenever leadership is gained or lost."""

    @property
    def is_leader(self) -> bool:
        return self._leader and self._clock() - self._renewed_at < self._duration

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            log.info("%s %s the %s lease", self.identity, "holds" if leader else "lost", self.name)
            self._leader = leader
            self.changed.set()

    def _spec(self, now: float, transitions: int, acquired: str | None) -> JsonDict:
        return {
            "holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self._duration)),
            "acquireTime": acquired or _micro_time(now), "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    async def try_once(self) -> bool:
        """One round of the protocol; whether this replica holds the lease now."""
        now = self._clock()
        try:
            try:
                lease = await self._client.get(LEASE, self.namespace, self.name)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                await self._client.create(LEASE, self.namespace, {
                    "apiVersion": LEASE.api_version, "kind": LEASE.kind,
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, 0, None),
                })
                self._renewed_at = now
                self._set(True)
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            duration = float(spec.get("leaseDurationSeconds") or self._duration)
            expired = _parse_time(spec.get("renewTime")) + duration < now
            if holder != self.identity and not expired:
                self._set(False)
                return False
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
            acquired = spec.get("acquireTime") if holder == self.identity else None
            lease["spec"] = self._spec(now, transitions, acquired)
            await self._client.replace(LEASE, self.namespace, self.name, lease)
        except ApiError as exc:
            if exc.status != 409:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            self._set(self.is_leader)  # keeps leading until its last renewal expires
            return self.is_leader
        self._renewed_at = now
        self._set(True)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.try_once()
            except Exception:  # (a bug: said; the next round tries again, leading until the lease expires)
                log.exception("lease %s/%s", self.namespace, self.name)
                self._set(self.is_leader)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._retry)
        self._set(False)
