"""A rule's RequestMirror filters as Envoy's ``request_mirror_policies``.

Envoy's router sends each mirrored request's copy to the mirror's cluster after the filters have run
and drops its answer: the copy carries the request as the picker left it (a rewritten model, the
picker's headers) and is never picked itself. So a copy to a Service goes to that Service's
cluster, and a copy to an InferencePool to a cluster of its own that balances over the pool's
replicas that serve requests (its prefill-only replicas in a disaggregated pool take none): the
mirror pool's picker neither sees nor counts the copies, whose load shows in its replicas' scraped
metrics only. ``percent`` and ``fraction`` become Envoy's runtime fraction in millionths.

Used for shadow traffic: a new model server version, or another engine, answering the production
requests beside the serving pool without its answers reaching clients.
"""

from __future__ import annotations

from typing import Any

from kvgate.gateway.controlplane.resources import BackendKind, ResolvedRule
from kvgate.gateway.controlplane.resources.gateway_api import MILLION
from kvgate.gateway.controlplane.translate.backends import (
    ClusterSet,
    service_cluster,
    static_cluster,
    with_pool_protocol,
)
from kvgate.gateway.controlplane.translate.names import mirror_cluster_name
from kvgate.policies.types import Role

JsonDict = dict[str, Any]


def mirror_policies(rule: ResolvedRule, clusters: ClusterSet) -> list[JsonDict]:
    """The rule's mirrors with a usable backend (an unusable one is in the route's ResolvedRefs)."""
    policies: list[JsonDict] = []
    for mirror in rule.mirrors:
        backend = mirror.backend
        if not backend.valid:
            continue
        if backend.kind is BackendKind.SERVICE:
            name = clusters.add(service_cluster(backend))
        elif backend.kind is BackendKind.INFERENCE_POOL and backend.pool is not None:
            pool = backend.pool
            serving = tuple(e.address for e in pool.endpoints if e.role is not Role.PREFILL)
            cluster = static_cluster(mirror_cluster_name(pool.id), serving)
            name = clusters.add(with_pool_protocol(pool, cluster))
        else:
            continue
        policy: JsonDict = {"cluster": name}
        if mirror.millionths < MILLION:
            share = {"numerator": mirror.millionths, "denominator": "MILLION"}
            policy["runtime_fraction"] = {"default_value": share}
        policies.append(policy)
    return policies
