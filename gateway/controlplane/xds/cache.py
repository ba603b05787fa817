"""Snapshots per Envoy node id, with a default for any node, and change watches.

``set_snapshot`` publishes only consistent snapshots: an inconsistent one raises :class:`ConfigError`
and the last good snapshot keeps being served. Watchers are plain callbacks run synchronously by
``set_snapshot``, so the cache must be used from the event loop's thread (the ADS server's callback
only enqueues). Nothing polls.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final

from kvgate.gateway.controlplane.xds.consistency import check_consistent
from kvgate.gateway.controlplane.xds.snapshot import Snapshot

ANY_NODE: Final = "*"
"""The node id under which the default snapshot, served to nodes without their own, is set."""

SnapshotWatcher = Callable[[Snapshot], None]
Unwatch = Callable[[], None]


class SnapshotCache:
    """The latest good snapshot per node id (and :data:`ANY_NODE`), and who to tell when one changes."""

    def __init__(self, *, static_clusters: Collection[str] = ()) -> None:
        """``static_clusters``: clusters Envoy has from its bootstrap, which snapshots may name."""
        self._static_clusters = frozenset(static_clusters)
        self._snapshots: dict[str, Snapshot] = {}
        self._watchers: dict[str, list[SnapshotWatcher]] = {}

    def set_snapshot(self, node_id: str, snapshot: Snapshot) -> None:
        """Publish ``snapshot`` for ``node_id`` (or :data:`ANY_NODE`) after checking its consistency.

        Raises :class:`ConfigError` for an inconsistent snapshot, keeping the previous one. Setting a
        snapshot with the version already published is a no-op.
        """
        check_consistent(snapshot, self._static_clusters)
        previous = self._snapshots.get(node_id)
        if previous is not None and previous.version == snapshot.version:
            return
        self._snapshots[node_id] = snapshot
        affected = (
            [node for node in self._watchers if node == ANY_NODE or node not in self._snapshots]
            if node_id == ANY_NODE
            else [node_id]
        )
        for node in affected:
            for watcher in list(self._watchers.get(node, ())):
                watcher(snapshot)

    def clear_snapshot(self, node_id: str) -> None:
        """Forget ``node_id``'s own snapshot; the node falls back to the default one (if any)."""
        if self._snapshots.pop(node_id, None) is not None and node_id != ANY_NODE:
            default = self._snapshots.get(ANY_NODE)
            if default is not None:
                for watcher in list(self._watchers.get(node_id, ())):
                    watcher(default)

    def snapshot_for(self, node_id: str) -> Snapshot | None:
        """The snapshot served to ``node_id``: its own, else the default, else ``None``."""
        return self._snapshots.get(node_id) or self._snapshots.get(ANY_NODE)

    def node_ids(self) -> list[str]:
        """Node ids with a snapshot of their own (``ANY_NODE`` included when a default is set)."""
        return sorted(self._snapshots)

    def watch(self, node_id: str, watcher: SnapshotWatcher) -> Unwatch:
        """Call ``watcher(snapshot)`` whenever the snapshot served to ``node_id`` changes.

        Returns a function that removes the watch.
        """
        self._watchers.setdefault(node_id, []).append(watcher)

        def unwatch() -> None:
            watchers = self._watchers.get(node_id, [])
            if watcher in watchers:
                watchers.remove(watcher)
            if not watchers:
                self._watchers.pop(node_id, None)

        return unwatch
