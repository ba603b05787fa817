from __future__ import annotations

import pytest

from kvgate.gateway.controlplane.xds import ANY_NODE, Snapshot, SnapshotCache
from kvgate.policies.errors import ConfigError
from tests.gateway.controlplane.xds.envoy_dicts import listener, route_config, static_cluster


def snapshot(body: str) -> Snapshot:
    return Snapshot.from_dicts(
        listeners=[listener("http", 8080, "main")],
        routes=[route_config("main", body=body, cluster="pool")],
        clusters=[static_cluster("pool")],
    )


def test_nodes_get_their_own_snapshot_or_the_default() -> None:
    cache = SnapshotCache()
    assert cache.snapshot_for("envoy-1") is None
    default, own = snapshot("default"), snapshot("own")
    cache.set_snapshot(ANY_NODE, default)
    cache.set_snapshot("envoy-1", own)
    assert cache.snapshot_for("envoy-1") is own
    assert cache.snapshot_for("envoy-2") is default
    cache.clear_snapshot("envoy-1")
    assert cache.snapshot_for("envoy-1") is default
    assert cache.node_ids() == [ANY_NODE]


def test_an_inconsistent_snapshot_is_refused_and_the_last_good_one_stays() -> None:
    cache = SnapshotCache()
    good = snapshot("good")
    cache.set_snapshot(ANY_NODE, good)
    seen: list[Snapshot] = []
    cache.watch("envoy-1", seen.append)
    dangling = Snapshot.from_dicts(listeners=[listener("http", 8080, "nowhere")])
    with pytest.raises(ConfigError, match="'nowhere', which does not exist"):
        cache.set_snapshot(ANY_NODE, dangling)
    assert cache.snapshot_for("envoy-1") is good
    assert seen == []


def test_static_clusters_make_references_consistent() -> None:
    cache = SnapshotCache(static_clusters=["pool"])
    cache.set_snapshot(
        ANY_NODE,
        Snapshot.from_dicts(listeners=[listener("h", 1, "r")], routes=[route_config("r", cluster="pool")]),
    )


def test_watches_fire_for_the_nodes_whose_snapshot_changed() -> None:
    cache = SnapshotCache()
    seen: dict[str, list[str]] = {"envoy-1": [], "envoy-2": []}
    cache.set_snapshot("envoy-1", snapshot("own"))
    cache.watch("envoy-1", lambda s: seen["envoy-1"].append(s.version))
    unwatch_2 = cache.watch("envoy-2", lambda s: seen["envoy-2"].append(s.version))

    default = snapshot("default")
    cache.set_snapshot(ANY_NODE, default)  # envoy-1 has its own: only envoy-2 sees the default change
    assert seen == {"envoy-1": [], "envoy-2": [default.version]}

    cache.set_snapshot(ANY_NODE, snapshot("default"))  # same version: no change
    assert seen["envoy-2"] == [default.version]

    newer = snapshot("own-2")
    cache.set_snapshot("envoy-1", newer)
    assert seen["envoy-1"] == [newer.version]

    cache.clear_snapshot("envoy-1")  # falls back to the default
    assert seen["envoy-1"] == [newer.version, default.version]

    unwatch_2()
    cache.set_snapshot(ANY_NODE, snapshot("default-2"))
    assert seen["envoy-2"] == [default.version]
    assert len(seen["envoy-1"]) == 3
