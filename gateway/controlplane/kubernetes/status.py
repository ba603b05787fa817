"""Status written back to the cluster: the conditions ``kvgate status`` shows, where ``kubectl get
-o yaml`` shows them.

:func:`desired_statuses` (pure) turns the validation's :class:`StatusReport` into each object's
``status``: a Gateway's ``conditions`` (Accepted, Programmed), ``listeners`` (their conditions,
``supportedKinds``, ``attachedRoutes``) and ``addresses``; an HTTPRoute's ``parents`` (one per
parentRef, with kvgate's ``controllerName``: Accepted, ResolvedRefs); an InferencePool's ``parents``
(one per Gateway whose routes reference it: Accepted, ResolvedRefs), as the Inference Extension
defines them; a BackendTLSPolicy's ``ancestors`` (one per Gateway whose routes reach one of its
targets, with kvgate's ``controllerName``: Accepted, ResolvedRefs). Each condition carries
``observedGeneration``; ``lastTransitionTime`` is kept from the last write while the condition's
status does not change.

:class:`StatusWriter` patches the status subresource only when an object's status changed since it
last wrote it, and keeps other controllers' entries in ``parents`` (a route attached to several
gateways of several implementations).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ipaddress
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kvgate.gateway.controlplane.kubernetes.client import ApiError, KindSpec, KubeClient
from kvgate.gateway.controlplane.kubernetes.lease import LeaderElector
from kvgate.gateway.controlplane.resources.conditions import ResourceStatus, StatusReport
from kvgate.gateway.controlplane.resources.meta import ResourceRef
from kvgate.gateway.controlplane.resources.resolved import ValidatedConfig
from kvgate.gateway.controlplane.resources.validate import ROUTE_KINDS

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
CONTROLLER_NAME = "kvgate.io/gateway-controller"
GATEWAY_GROUP = "gateway.networking.k8s.io"
WRITTEN_KINDS: Mapping[str, KindSpec] = {
    "Gateway": KindSpec("gateway.networking.k8s.io/v1", "Gateway", "gateways"),
    "HTTPRoute": KindSpec("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    "GRPCRoute": KindSpec("gateway.networking.k8s.io/v1", "GRPCRoute", "grpcroutes"),
    "InferencePool": KindSpec("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    "BackendTLSPolicy": KindSpec("gateway.networking.k8s.io/v1", "BackendTLSPolicy", "backendtlspolicies"),
    "GatewayClass": KindSpec(
        "gateway.networking.k8s.io/v1", "GatewayClass", "gatewayclasses", namespaced=False
    ),
}


SUPPORTED_FEATURES = frozenset({
    "Gateway", "GatewayHTTPListenerIsolation", "GatewayPort8080", "HTTPRoute", "ReferenceGrant",
    "GRPCRoute", "GRPCRouteNamedRouteRule", "GRPCRouteRequestHeaderModifier",
    "HTTPRouteBackendProtocolH2C", "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification", "HTTPRouteBackendTimeout", "HTTPRouteCORS",
    "HTTPRouteHostRewrite", "HTTPRouteMethodMatching", "HTTPRouteNamedRouteRule", "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect", "HTTPRoutePathRewrite", "HTTPRoutePortRedirect", "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror", "HTTPRouteRequestMultipleMirrors", "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout", "HTTPRouteResponseHeaderModification", "HTTPRouteSchemeRedirect",
    "HTTPRoute303RedirectStatusCode", "HTTPRoute307RedirectStatusCode", "HTTPRoute308RedirectStatusCode",
    "BackendTLSPolicy", "BackendTLSPolicySANValidation",
})
"""The Gateway API's conformance features (its ``pkg/features`` names) kvgate implements, as a
GatewayClass's ``status.supportedFeatures`` lists them (sorted by name)."""


def class_statuses(classes: Iterable[tuple[str, int]]) -> dict[ResourceRef, JsonDict]:
    """Accepted, and the features supported, for each GatewayClass kvgate implements ((name,
    generation) pairs)."""
    features = [{"name": name} for name in sorted(SUPPORTED_FEATURES)]
    return {
        ResourceRef("GatewayClass", "", name): {"conditions": [{
            "type": "Accepted", "status": "True", "reason": "Accepted",
            "message": "kvgate implements this class", "observedGeneration": generation,
        }], "supportedFeatures": features}
        for name, generation in classes
    }


def _conditions(entry: ResourceStatus) -> list[JsonDict]:
    return [
        {"type": c.type, "status": str(c.status), "reason": c.reason, "message": c.message,
         "observedGeneration": c.observed_generation}
        for c in entry.conditions
    ]


def _parent_ref(parent: ResourceRef) -> JsonDict:
    return {"group": GATEWAY_GROUP, "kind": parent.kind, "namespace": parent.namespace, "name": parent.name}


def gateway_address(address: str) -> JsonDict:
    """A Gateway ``status.addresses`` entry: ``IPAddress`` for an IP, else ``Hostname``."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return {"type": "Hostname", "value": address}
    return {"type": "IPAddress", "value": address}


def desired_statuses(report: StatusReport, addresses: Iterable[str] = ()) -> dict[ResourceRef, JsonDict]:
    """Each written object's status (without ``lastTransitionTime``), from one validation."""
    out: dict[ResourceRef, JsonDict] = {}
    attached: dict[tuple[ResourceRef, str], int] = {}  # (Gateway, listener) → routes it took
    for entry in report.entries:
        if entry.resource.kind in ROUTE_KINDS and entry.parent is not None:
            accepted = entry.get("Accepted")
            if accepted is not None and accepted.is_true:
                for listener in entry.listeners:
                    attached[(entry.parent, listener)] = attached.get((entry.parent, listener), 0) + 1
    for entry in report.entries:
        ref = entry.resource
        if ref.kind == "Gateway":
            typed = [gateway_address(address) for address in addresses]
            status = out.setdefault(ref, {"conditions": [], "listeners": [], "addresses": typed})
            if entry.section is None:
                status["conditions"] = _conditions(entry)
            else:
                kinds = [{"group": GATEWAY_GROUP, "kind": kind} for kind in entry.supported_kinds]
                status["listeners"].append({
                    "name": entry.section,
                    "supportedKinds": kinds,
                    "attachedRoutes": attached.get((ref, entry.section), 0),
                    "conditions": _conditions(entry),
                })
        elif ref.kind in ROUTE_KINDS and entry.parent is not None:
            out.setdefault(ref, {"parents": []})["parents"].append({
                "parentRef": _parent_ref(entry.parent), "controllerName": CONTROLLER_NAME,
                "conditions": _conditions(entry),
            })
        elif ref.kind == "BackendTLSPolicy" and entry.parent is not None:
            out.setdefault(ref, {"ancestors": []})["ancestors"].append({
                "ancestorRef": _parent_ref(entry.parent), "controllerName": CONTROLLER_NAME,
                "conditions": _conditions(entry),
            })
        elif ref.kind == "InferencePool" and entry.parent is not None:
            out.setdefault(ref, {"parents": []})["parents"].append({
                "parentRef": _parent_ref(entry.parent), "controllerName": CONTROLLER_NAME,
                "conditions": _conditions(entry),
            })
    return out


def _with_times(status: JsonDict, previous: JsonDict | None, now: str) -> JsonDict:
    """``status`` with ``lastTransitionTime`` on each condition: the previous one while the
    condition's status is unchanged, else ``now``."""
    before: dict[tuple[str, str], JsonDict] = {}

    def index(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for cond in node.get("conditions", []):
                before[(path, cond["type"])] = cond
            for key, value in node.items():
                if isinstance(value, list):
                    for item in value:
                        index(item, f"{path}/{key}/{_identity(item)}")

    def stamp(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for cond in node.get("conditions", []):
                old = before.get((path, cond["type"]))
                same = old is not None and old.get("status") == cond["status"] and "lastTransitionTime" in old
                cond["lastTransitionTime"] = old["lastTransitionTime"] if same and old else now
            for key, value in node.items():
                if isinstance(value, list):
                    for item in value:
                        stamp(item, f"{path}/{key}/{_identity(item)}")

    if previous is not None:
        index(previous, "")
    stamped = copy.deepcopy(status)
    stamp(stamped, "")
    return stamped


def _identity(item: Any) -> str:
    if not isinstance(item, dict):
        return ""
    for key in ("parentRef", "ancestorRef"):
        if key in item:
            ref = item[key]
            return f"{ref.get('namespace')}/{ref.get('name')}"
    return str(item.get("name", item.get("type", "")))


def _others(previous: list[JsonDict], ours: list[JsonDict]) -> list[JsonDict]:
    """The entries of ``previous`` another controller wrote: another ``controllerName``, and (an
    InferencePool's, whose ``controllerName`` is optional: the Inference Extension's own controllers
    may leave it out) not for a parent kvgate writes now. Several gateway implementations may route
    to one pool (a migration from one to another): each keeps its own parents' entries."""
    mine = {json.dumps(entry.get("parentRef", entry.get("ancestorRef")), sort_keys=True) for entry in ours}
    return [entry for entry in previous
            if entry.get("controllerName") != CONTROLLER_NAME
            and json.dumps(entry.get("parentRef", entry.get("ancestorRef")), sort_keys=True) not in mine]


class StatusWriter:
    def __init__(self, client: KubeClient, addresses: Iterable[str] = ()) -> None:
        self._client = client
        self._addresses = tuple(addresses)
        self._written: dict[ResourceRef, JsonDict] = {}
        self.writes = 0
        self.failed = 0
        """Objects the last :meth:`write` could not write (the API server refused or did not answer)."""

    def forget(self) -> None:
        """Write every status again on the next :meth:`write` (a new lease holder's first)."""
        self._written.clear()

    async def write(self, report: StatusReport, classes: Iterable[tuple[str, int]] = ()) -> int:
        """Patch every object whose status changed since this writer last wrote it (and the
        GatewayClasses kvgate implements); the count."""
        written = failed = 0
        wanted = {**desired_statuses(report, self._addresses), **class_statuses(classes)}
        for ref, status in wanted.items():
            if self._written.get(ref) == status:
                continue
            spec = WRITTEN_KINDS[ref.kind]
            try:
                current = await self._client.get(spec, ref.namespace or None, ref.name)
                previous = current.get("status") or {}
                merged = dict(status)
                for field in ("parents", "ancestors"):  # keep other controllers' entries
                    if field in status and ref.kind in (*ROUTE_KINDS, "BackendTLSPolicy", "InferencePool"):
                        merged[field] = [*_others(previous.get(field, []), status[field]), *status[field]]
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                stamped = _with_times(merged, previous, now)
                await self._client.patch_status(spec, ref.namespace or None, ref.name, stamped)
            except ApiError as exc:
                if exc.status != 404:  # an object deleted meanwhile needs no status
                    log.warning("status of %s %s/%s not written: %s", ref.kind, ref.namespace, ref.name, exc)
                    failed += 1
                continue
            self._written[ref] = status
            written += 1
        self.writes += written
        self.failed = failed
        return written


RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0


class StatusPublisher:
    """Writes the status of each applied configuration while this replica holds the status Lease
    (``lease.LeaderElector``); a replica that becomes the holder writes everything once. A write
    the API server refuses or leaves unanswered is tried again (after 0.5 s, doubling to 30 s) until
    it lands or a newer configuration replaces it: a status is never left stale until the next
    change, and no error stops the writing."""

    def __init__(
        self, client: KubeClient, elector: LeaderElector, writer: StatusWriter,
        classes: Callable[[], list[tuple[str, int]]],
    ) -> None:
        """``classes``: the GatewayClasses to mark Accepted (the provider's ``gateway_classes``)."""
        self._classes = classes
        self._client = client
        self._elector = elector
        self._writer = writer
        self._latest: StatusReport | None = None
        self._dirty = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def notify(self, config: ValidatedConfig) -> None:
        """The control plane applied ``config`` (its ``on_applied`` hook)."""
        self._latest = config.status
        self._dirty.set()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._elector.run(self._stop)), asyncio.create_task(self._run())]

    async def _run(self) -> None:
        leading = False
        retry_s: float | None = None
        while not self._stop.is_set():
            events = (self._dirty, self._elector.changed, self._stop)
            waits = {asyncio.ensure_future(event.wait()) for event in events}
            await asyncio.wait(waits, timeout=retry_s, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waits:
                waiter.cancel()
            self._dirty.clear()
            self._elector.changed.clear()
            now_leading = self._elector.is_leader
            if now_leading and not leading:
                self._writer.forget()  # a new holder does not trust what an earlier one wrote
            leading = now_leading
            if not leading or self._latest is None:
                retry_s = None
                continue
            try:
                await self._writer.write(self._latest, self._classes())
                unwritten = self._writer.failed > 0
            except Exception:  # (a bug: said, and tried again, never the end of status writing)
                log.exception("writing status")
                unwritten = True
            retry_s = None if not unwritten else min(RETRY_MAX_S, retry_s * 2) if retry_s else RETRY_FIRST_S

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._client.close()
