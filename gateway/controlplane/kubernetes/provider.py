"""The configuration as a Kubernetes cluster holds it: the provider ``kvgate up --kubernetes`` uses,
beside the file provider and with the same interface (``first``, ``updates``, ``status``).

It follows, with one informer each (``informer.follow``: list, then watch from the list's
resourceVersion, resume on a dropped watch, list again on 410 Gone, back off on errors), Gateways,
HTTPRoutes, GRPCRoutes and ReferenceGrants (Gateway API), InferencePools, InferenceObjectives and
InferenceModelRewrites (the Inference Extension), Services (plain ``backendRefs``, pickers) and
Pods (the pools' endpoints; a Pod that is not Ready or is being deleted is no endpoint: the resource
model's rule), in one namespace or (without ``namespace``) all of them, Namespaces too then. After a
burst of changes settles (``quiet_s``, at most ``max_batch_s`` after its first), the objects are
parsed and validated as the manifests of a directory would be, and published as a
:class:`~gateway.controlplane.resources.ConfigSnapshot` when their content changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

from kvgate.gateway.controlplane.kubernetes.client import KindSpec, KubeClient
from kvgate.gateway.controlplane.kubernetes.informer import ObjectCache, follow
from kvgate.gateway.controlplane.resources import ConfigSnapshot, ProviderStatus, ValidationOptions, validate
from kvgate.gateway.controlplane.resources.loader import parse_manifests
from kvgate.policies.errors import ConfigError

log = logging.getLogger(__name__)

KINDS = (
    KindSpec("gateway.networking.k8s.io/v1", "Gateway", "gateways"),
    KindSpec("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    KindSpec("gateway.networking.k8s.io/v1", "GRPCRoute", "grpcroutes"),
    KindSpec("gateway.networking.k8s.io/v1beta1", "ReferenceGrant", "referencegrants"),
    KindSpec("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    KindSpec("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective", "inferenceobjectives"),
    KindSpec("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite", "inferencemodelrewrites"),
    # llm-d's router's (v0.9 on): the same kinds in its own group, used where both hold one name
    KindSpec("llm-d.ai/v1alpha2", "InferenceObjective", "inferenceobjectives"),
    KindSpec("llm-d.ai/v1alpha2", "InferenceModelRewrite", "inferencemodelrewrites"),
    KindSpec("v1", "Service", "services"),
    KindSpec("v1", "Pod", "pods"),
    # HTTPS listeners' certificates: TLS Secrets only (not every Secret of the cluster, e.g. Helm's
    # large release records, each change of which would rebuild the configuration)
    KindSpec("v1", "Secret", "secrets", field_selector="type=kubernetes.io/tls"),
    # BackendTLSPolicies and the ConfigMaps their CA certificates are in (any ConfigMap may be named:
    # every one is followed, the configuration built from those a policy names: ``_build``)
    KindSpec("gateway.networking.k8s.io/v1", "BackendTLSPolicy", "backendtlspolicies"),
    KindSpec("v1", "ConfigMap", "configmaps"),
)
NAMESPACES = KindSpec("v1", "Namespace", "namespaces", namespaced=False)
GATEWAY_CLASSES = KindSpec("gateway.networking.k8s.io/v1", "GatewayClass", "gatewayclasses", namespaced=False)
CONTROLLER_NAME = "kvgate.io/gateway-controller"
"""The ``spec.controllerName`` of the GatewayClasses kvgate implements."""
PICKER_KINDS = tuple(k for k in KINDS if k.plural in (
    "inferencepools", "inferenceobjectives", "inferencemodelrewrites", "pods",
))
"""What an endpoint picker serving one pool reads (``kvgate picker --kubernetes``): least privilege."""
REQUIRED = frozenset({"gateways", "httproutes", "inferencepools"})
"""Kinds without which kvgate cannot work: their CRDs must be installed."""
SUPPORTED_RELEASES = "Gateway API v1.4 (standard channel) and the Gateway API Inference Extension v1.5"
"""The upstream CRD releases kvgate is tested with (README: how to install them)."""


class KubernetesProvider:
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str | None = None,
        options: ValidationOptions | None = None,
        quiet_s: float = 0.05,
        max_batch_s: float = 0.2,
        watch_timeout_s: int = 300,
        kinds: tuple[KindSpec, ...] | None = None,
        controller_name: str | None = CONTROLLER_NAME,
        extra_objects: tuple[dict[str, Any], ...] = (),
    ) -> None:
        """``kinds``: what to follow (default: everything ``kvgate up`` needs, Namespaces too when
        following every namespace). ``controller_name``: only Gateways of a GatewayClass with this
        ``spec.controllerName`` are kvgate's (None: every Gateway, as with manifest files).
        ``extra_objects``: manifests that are not in the cluster, read with what it holds (the pool
        ``kvgate picker --endpoint-selector`` builds from its flags)."""
        self._client = client
        self._extra = extra_objects
        self._controller = controller_name
        self._namespace = namespace
        self._options = options or ValidationOptions()
        self._quiet_s = quiet_s
        self._max_batch_s = max_batch_s
        self._watch_timeout_s = watch_timeout_s
        if kinds is None:
            kinds = KINDS if namespace is not None else (*KINDS, NAMESPACES)
            if controller_name is not None:
                kinds = (*kinds, GATEWAY_CLASSES)
        self._caches = [ObjectCache(spec) for spec in kinds]
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._current: ConfigSnapshot | None = None
        self._last_error: str | None = None
        self._last_error_at: float | None = None

    @property
    def current(self) -> ConfigSnapshot | None:
        return self._current

    def status(self) -> ProviderStatus:
        current = self._current
        return ProviderStatus(
            directory=f"kubernetes:{self._namespace or '*'}",
            version=current.version if current else 0,
            content_hash=current.content_hash if current else "",
            last_error=self._last_error,
            last_error_at=self._last_error_at,
            loaded_at=current.loaded_at if current else None,
        )

    def _start(self) -> None:
        if self._tasks:
            return
        for cache in self._caches:
            self._tasks.append(asyncio.create_task(follow(
                self._client, cache, self._namespace if cache.spec.namespaced else None,
                self._changed.set, self._stop, watch_timeout_s=self._watch_timeout_s,
            )))

    async def first(self, timeout_s: float = 30.0) -> ConfigSnapshot:
        """Start following; the configuration once every kind has been listed once."""
        self._start()
        deadline = time.monotonic() + timeout_s
        while not all(cache.synced for cache in self._caches):
            if time.monotonic() > deadline:
                missing = [c.spec.plural for c in self._caches if not c.synced]
                raise ConfigError(f"the Kubernetes API did not list {', '.join(missing)} in {timeout_s:g} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.1)
        missing = sorted(c.spec.plural for c in self._caches if c.missing)
        if REQUIRED & set(missing):
            raise ConfigError(
                f"the cluster does not serve {', '.join(sorted(REQUIRED & set(missing)))}: install the CRDs "
                f"of {SUPPORTED_RELEASES}"
            )
        if missing:
            log.warning("the cluster does not serve %s (optional; %s)", ", ".join(missing),
                        SUPPORTED_RELEASES)
        snapshot = self._build()
        if snapshot is None:
            raise ConfigError(f"the cluster's configuration does not load: {self._last_error}")
        return snapshot

    def gateway_classes(self) -> list[tuple[str, int]]:
        """(name, generation) of the GatewayClasses kvgate implements (``controller_name``'s)."""
        found = []
        for cache in self._caches:
            if cache.spec is GATEWAY_CLASSES:
                for obj in cache.objects():
                    if (obj.get("spec") or {}).get("controllerName") == self._controller:
                        meta = obj["metadata"]
                        found.append((str(meta["name"]), int(meta.get("generation") or 1)))
        return sorted(found)

    def _named_config_maps(self) -> set[tuple[str, str]]:
        """(namespace, name) of the ConfigMaps a BackendTLSPolicy names as CA certificates."""
        named: set[tuple[str, str]] = set()
        for cache in self._caches:
            if cache.spec.plural != "backendtlspolicies":
                continue
            for policy in cache.objects():
                namespace = policy["metadata"].get("namespace", "")
                validation = (policy.get("spec") or {}).get("validation") or {}
                for ref in validation.get("caCertificateRefs") or ():
                    if isinstance(ref, dict) and ref.get("kind") == "ConfigMap":
                        named.add((namespace, str(ref.get("name"))))
        return named

    def _build(self) -> ConfigSnapshot | None:
        """The caches as a snapshot (the current one when nothing changed); None when invalid. Of the
        ConfigMaps, only those a BackendTLSPolicy names count: another one changing (a controller's
        state, a leader election's record) changes nothing."""
        named = self._named_config_maps()

        def used(spec: KindSpec, obj: dict[str, Any]) -> bool:
            if spec.plural != "configmaps":
                return True
            return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"]) in named

        files = [
            (f"kubernetes:{obj['apiVersion']}/{obj['kind']}/{obj['metadata'].get('namespace', '')}/"
             f"{obj['metadata']['name']}", json.dumps(obj, sort_keys=True))
            for cache in self._caches if cache.spec is not GATEWAY_CLASSES
            for obj in cache.objects() if used(cache.spec, obj)
        ]
        files.extend((f"flags:{obj['kind']}/{obj['metadata']['name']}", json.dumps(obj, sort_keys=True))
                     for obj in self._extra)
        if self._controller is not None:  # the class names are part of what decides the configuration
            classes = json.dumps(self.gateway_classes())
            files.append(("kubernetes:GatewayClasses", f"# {classes}\n"))
        try:
            resources = parse_manifests(files)
        except ConfigError as exc:
            self._last_error, self._last_error_at = exc.message, time.time()
            log.warning("keeping configuration version %s: %s",
                        self._current.version if self._current else 0, exc.message)
            return None
        self._last_error = self._last_error_at = None
        current = self._current
        if current is not None and current.content_hash == resources.content_hash:
            return current
        options = self._options
        if self._controller is not None:
            names = frozenset(name for name, _ in self.gateway_classes())
            options = dataclasses.replace(options, gateway_classes=names)
        config = validate(resources, options, current.config.certificates() if current else None)
        version = current.version + 1 if current else 1
        self._current = ConfigSnapshot(version, resources.content_hash, resources, config, time.time())
        return self._current

    async def updates(self, stop: asyncio.Event | None = None) -> AsyncGenerator[ConfigSnapshot, None]:
        """The current snapshot, then each new one, until ``stop`` is set."""
        self._start()
        stop = stop or asyncio.Event()
        if self._current is not None:
            yield self._current
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                changed = asyncio.ensure_future(self._changed.wait())
                await asyncio.wait({changed, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    changed.cancel()
                    break
                await self._settle()
                before = self._current
                snapshot = self._build()
                if snapshot is not None and snapshot is not before:
                    yield snapshot
        finally:
            stopper.cancel()

    async def _settle(self) -> None:
        """Wait until no change came for ``quiet_s``, at most ``max_batch_s`` in all."""
        deadline = time.monotonic() + self._max_batch_s
        while True:
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), min(self._quiet_s, remaining))
            except TimeoutError:
                return

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self._client.close()
