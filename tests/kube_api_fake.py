"""A FAKE Kubernetes API server, for tests only: no real one can be installed on these machines.

It behaves like the real one where kvgate's client depends on it, following the API conventions
(https://kubernetes.io/docs/reference/using-api/api-concepts/):

- list: ``GET /api/v1/[namespaces/NS/]RESOURCE`` and ``/apis/GROUP/VERSION/[namespaces/NS/]RESOURCE``
  answer a ``…List`` whose ``metadata.resourceVersion`` is the store's, with items that (as the
  real server's) carry no ``apiVersion``/``kind``;
- watch (``?watch=true&resourceVersion=RV``): newline-delimited JSON events (ADDED, MODIFIED, DELETED)
  after ``RV``, ``BOOKMARK`` events when ``allowWatchBookmarks`` is set, and, when ``RV`` is older
  than the retained history (compacted), one ``ERROR`` event with a 410 ``Status`` (Expired), as the
  real server answers a watch from too old a version; a watch ends after ``timeoutSeconds``;
- every write bumps one cluster-wide resourceVersion; objects keep ``metadata.generation``, which a
  spec change bumps (a status write does not);
- get one object (``…/RESOURCE/NAME``); the status subresource (``PATCH …/NAME/status``, a JSON
  merge patch of ``status`` only); create (``POST``, 409 if it exists) and replace (``PUT``, 409 when
  ``metadata.resourceVersion`` is not the stored one: optimistic concurrency, as Leases rely on);
- 403 for a verb the caller's role does not grant (:meth:`deny`);
- TokenReview (tokens in :attr:`tokens`, token -> user name) and SubjectAccessReview (``get`` on a
  non-resource URL allowed for the users in :attr:`metrics_readers`), created and answered, not
  stored, as the real server does.

Test controls (plain methods, not HTTP): :meth:`apply`, :meth:`delete`, :meth:`compact` (forget the
event history), :meth:`drop_watches` (end every open watch, as an API server restart or a load
balancer does), :meth:`fail_next` (answer the next N requests with an error status).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    resource: str = ""
    """How the fake keys the kind's objects (and ``deny``, ``unserved``, ``get_object`` name it): its
    plural, or ``plural.group`` for a kind whose plural another group has too."""

    @property
    def key(self) -> str:
        return self.resource or self.plural


KINDS = (
    Kind("v1", "Pod", "pods"),
    Kind("v1", "Service", "services"),
    Kind("v1", "Secret", "secrets"),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Namespace", "namespaces", namespaced=False),
    Kind("gateway.networking.k8s.io/v1", "GatewayClass", "gatewayclasses", namespaced=False),
    Kind("gateway.networking.k8s.io/v1", "Gateway", "gateways"),
    Kind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    Kind("gateway.networking.k8s.io/v1", "GRPCRoute", "grpcroutes"),
    Kind("gateway.networking.k8s.io/v1beta1", "ReferenceGrant", "referencegrants"),
    Kind("gateway.networking.k8s.io/v1", "BackendTLSPolicy", "backendtlspolicies"),
    Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    Kind("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective", "inferenceobjectives"),
    Kind("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite", "inferencemodelrewrites"),
    Kind("llm-d.ai/v1alpha2", "InferenceObjective", "inferenceobjectives",
         resource="inferenceobjectives.llm-d.ai"),
    Kind("llm-d.ai/v1alpha2", "InferenceModelRewrite", "inferencemodelrewrites",
         resource="inferencemodelrewrites.llm-d.ai"),
    Kind("coordination.k8s.io/v1", "Lease", "leases"),
    Kind("authentication.k8s.io/v1", "TokenReview", "tokenreviews", namespaced=False),
    Kind("authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False),
)


def _field_selector(request: web.Request) -> Callable[[JsonDict], bool]:
    """The API server's ``fieldSelector`` as far as kvgate uses it: ``type=...`` (Secrets)."""
    selector = request.query.get("fieldSelector")
    if not selector:
        return lambda obj: True
    field_name, _, value = selector.partition("=")
    if field_name != "type":
        raise web.HTTPBadRequest(text=f"field selector {selector!r} is not supported by the fake")
    return lambda obj: obj.get("type", "Opaque") == value


@dataclass
class _Event:
    rv: int
    type: str
    kind: Kind
    obj: JsonDict


@dataclass
class FakeApiServer:
    history_limit: int = 1000
    bookmark_interval_s: float = 0.2
    _rv: int = 1
    _objects: dict[tuple[str, str, str], JsonDict] = field(default_factory=dict)
    _events: list[_Event] = field(default_factory=list)
    _oldest: int = 1
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _watch_generation: int = 0
    _failures: list[int] = field(default_factory=list)
    _denied: set[tuple[str, str]] = field(default_factory=set)
    unserved: set[str] = field(default_factory=set)
    tokens: dict[str, str] = field(default_factory=dict)
    metrics_readers: set[str] = field(default_factory=set)
    """Plurals answered 404, as when their CRD is not installed."""
    requests: list[str] = field(default_factory=list)
    """``METHOD path?query`` of every request, in order (what the client asked)."""
    watches_opened: int = 0
    """Watches that are streaming events (a test can wait for one before dropping it)."""
    _runner: web.AppRunner | None = None
    port: int = 0

    # --- test controls -----------------------------------------------------------------------
    async def apply(self, obj: JsonDict) -> JsonDict:
        """Create or replace ``obj`` (as ``kubectl apply`` would); returns the stored object."""
        kind = _kind_of(obj["apiVersion"], obj["kind"])
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        key = (kind.key, meta.get("namespace", ""), meta["name"])
        previous = self._objects.get(key)
        stored = copy.deepcopy(obj)
        smeta = stored["metadata"]
        generation = 1
        if previous is not None:
            generation = previous["metadata"].get("generation", 1)
            if previous.get("spec") != stored.get("spec"):
                generation += 1
            smeta["uid"] = previous["metadata"]["uid"]
            smeta["creationTimestamp"] = previous["metadata"]["creationTimestamp"]
        else:
            smeta["uid"] = f"uid-{self._rv + 1}"
            smeta["creationTimestamp"] = "2026-11-24T00:00:00Z"
        smeta["generation"] = generation
        await self._write("MODIFIED" if previous is not None else "ADDED", kind, key, stored)
        return stored

    async def delete(self, api_version: str, kind_name: str, name: str, namespace: str = "default") -> None:
        kind = _kind_of(api_version, kind_name)
        key = (kind.key, namespace if kind.namespaced else "", name)
        if key in self._objects:
            await self._write("DELETED", kind, key, None)

    def compact(self) -> None:
        """Forget the event history: a watch from any earlier version now gets 410 Gone."""
        self._events.clear()
        self._oldest = self._rv

    async def drop_watches(self) -> None:
        self._watch_generation += 1
        async with self._changed:
            self._changed.notify_all()

    def fail_next(self, count: int, status: int = 500) -> None:
        self._failures.extend([status] * count)

    def deny(self, method: str, plural: str) -> None:
        """Answer 403 to ``method`` on ``plural`` (and its subresources), as RBAC would."""
        self._denied.add((method, plural))

    def allow(self, method: str, plural: str) -> None:
        """Undo :meth:`deny`."""
        self._denied.discard((method, plural))

    def get_object(self, plural: str, name: str, namespace: str = "default") -> JsonDict | None:
        found = self._objects.get((plural, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    @property
    def resource_version(self) -> int:
        return self._rv

    # --- serving -----------------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application()
        for method in ("GET", "POST", "PUT", "PATCH"):
            app.router.add_route(method, "/api/{version}/{rest:.*}", self._handle)
            app.router.add_route(method, "/apis/{group}/{version}/{rest:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1])
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _write(self, type_: str, kind: Kind, key: tuple[str, str, str], obj: JsonDict | None) -> None:
        async with self._changed:
            self._rv += 1
            if obj is None:
                gone = self._objects.pop(key)
                gone = copy.deepcopy(gone)
                gone["metadata"]["resourceVersion"] = str(self._rv)
                event_obj = gone
            else:
                obj["metadata"]["resourceVersion"] = str(self._rv)
                self._objects[key] = obj
                event_obj = obj
            self._events.append(_Event(self._rv, type_, kind, copy.deepcopy(event_obj)))
            if len(self._events) > self.history_limit:
                dropped = self._events.pop(0)
                self._oldest = dropped.rv
            self._changed.notify_all()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path_qs}")
        if self._failures:
            status = self._failures.pop(0)
            return web.json_response(_status(status, "injected failure"), status=status)
        kind, namespace, name, sub = self._route(request)
        if kind is None:
            return web.json_response(_status(404, f"no resource at {request.path}"), status=404)
        if (request.method, kind.key) in self._denied:
            return web.json_response(_status(403, f"{request.method} {kind.key} is forbidden"), status=403)
        if name is not None or request.method != "GET":
            return await self._object(request, kind, namespace or "", name, sub)
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request, kind, namespace)
        selected = _field_selector(request)
        items = [
            _without_type(obj) for (plural, ns, _), obj in sorted(self._objects.items())
            if plural == kind.key and (namespace is None or ns == namespace) and selected(obj)
        ]
        return web.json_response({
            "kind": f"{kind.kind}List", "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self._rv)}, "items": items,
        })

    def _route(self, request: web.Request) -> tuple[Kind | None, str | None, str | None, str | None]:
        """(kind, namespace, name, subresource) of the request's path."""
        group = request.match_info.get("group")
        version = request.match_info["version"]
        api_version = f"{group}/{version}" if group else version
        parts = request.match_info["rest"].strip("/").split("/")
        namespace = None
        if len(parts) >= 3 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        if not 1 <= len(parts) <= 3:
            return None, None, None, None
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        for kind in KINDS:
            served = kind.key not in self.unserved
            if served and kind.api_version == api_version and kind.plural == parts[0]:
                return kind, namespace, name, sub
        return None, None, None, None

    def _review(self, kind: Kind, body: JsonDict) -> JsonDict:
        spec = body.get("spec") or {}
        if kind.kind == "TokenReview":
            user = self.tokens.get(spec.get("token", ""))
            status: JsonDict = {"authenticated": user is not None}
            if user is not None:
                status["user"] = {"username": user, "groups": ["system:authenticated"]}
        else:
            attributes = spec.get("nonResourceAttributes") or {}
            allowed = spec.get("user") in self.metrics_readers and attributes.get("verb") == "get"
            status = {"allowed": allowed}
        return {**body, "status": status}

    async def _object(
        self, request: web.Request, kind: Kind, namespace: str, name: str | None, sub: str | None
    ) -> web.Response:
        if request.method == "POST" and kind.kind in ("TokenReview", "SubjectAccessReview"):
            return web.json_response(self._review(kind, await request.json()), status=201)
        if request.method == "POST":
            body = await request.json()
            body.setdefault("apiVersion", kind.api_version)
            body.setdefault("kind", kind.kind)
            body.setdefault("metadata", {})["namespace"] = namespace
            if (kind.key, namespace, body["metadata"]["name"]) in self._objects:
                return web.json_response(_status(409, "already exists"), status=409)
            return web.json_response(await self.apply(body), status=201)
        assert name is not None
        key = (kind.key, namespace if kind.namespaced else "", name)
        stored = self._objects.get(key)
        if stored is None:
            return web.json_response(_status(404, f"{kind.plural} {name} not found"), status=404)
        if request.method == "GET":
            return web.json_response(stored)
        body = await request.json()
        if request.method == "PATCH" and sub == "status":
            updated = copy.deepcopy(stored)
            updated["status"] = _merge(updated.get("status") or {}, body.get("status") or {})
            await self._write("MODIFIED", kind, key, updated)
            return web.json_response(updated)
        if request.method == "PUT" and sub is None:
            version = body.get("metadata", {}).get("resourceVersion")
            if version != stored["metadata"]["resourceVersion"]:
                return web.json_response(_status(409, "the object has been modified"), status=409)
            body["metadata"]["namespace"] = namespace
            return web.json_response(await self.apply(body))
        return web.json_response(_status(405, "not supported by the fake"), status=405)

    async def _watch(self, request: web.Request, kind: Kind, namespace: str | None) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self._rv)
        selected = _field_selector(request)
        bookmarks = request.query.get("allowWatchBookmarks") in ("1", "true")
        timeout_s = float(request.query.get("timeoutSeconds", "300"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since < self._oldest:
            expired = _status(410, f"too old resource version: {since}")
            await _send(response, {"type": "ERROR", "object": expired})
            return response
        generation = self._watch_generation
        self.watches_opened += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        sent_rv = since
        last_bookmark = loop.time()
        try:
            while loop.time() < deadline and generation == self._watch_generation:
                for event in [e for e in self._events if e.rv > sent_rv]:
                    sent_rv = event.rv
                    if event.kind != kind:
                        continue
                    if namespace is not None and event.obj["metadata"].get("namespace") != namespace:
                        continue
                    if not selected(event.obj):
                        continue
                    await _send(response, {"type": event.type, "object": event.obj})
                if bookmarks and loop.time() - last_bookmark >= self.bookmark_interval_s:
                    sent_rv = max(sent_rv, self._rv)
                    await _send(response, {"type": "BOOKMARK", "object": {
                        "kind": kind.kind, "apiVersion": kind.api_version,
                        "metadata": {"resourceVersion": str(sent_rv)},
                    }})
                    last_bookmark = loop.time()
                async with self._changed:
                    wait = min(self.bookmark_interval_s, max(0.0, deadline - loop.time()))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), wait)
        except (ConnectionResetError, asyncio.CancelledError):
            return response
        return response


def _kind_of(api_version: str, kind_name: str) -> Kind:
    for kind in KINDS:
        if kind.api_version == api_version and kind.kind == kind_name:
            return kind
    raise ValueError(f"the fake API server does not serve {api_version} {kind_name}")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _without_type(obj: Mapping[str, Any]) -> JsonDict:
    return {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("apiVersion", "kind")}


def _status(code: int, message: str) -> JsonDict:
    reason = {410: "Expired", 404: "NotFound", 403: "Forbidden", 409: "Conflict"}.get(code, "InternalError")
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}


async def _send(response: web.StreamResponse, event: JsonDict) -> None:
    await response.write(json.dumps(event).encode() + b"\n")
