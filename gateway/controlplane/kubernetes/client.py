"""The Kubernetes API as kvgate uses it: list a kind, watch it from a resourceVersion.

The client library is kubernetes_asyncio: the official client's configuration loading (kubeconfig
files and contexts, in-cluster service-account tokens, exec and OIDC auth plugins, client
certificates) and transport, on aiohttp, which kvgate already runs on. lightkube's typed models and
kr8s's ergonomic objects were the alternatives; kvgate parses every object with its own resource
models, so it needs the plain JSON objects and a watch it controls (resourceVersion, bookmarks,
410 handling), which kubernetes_asyncio's generic ``call_api`` gives without a second HTTP stack.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

JsonDict = dict[str, Any]


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One kind kvgate follows: ``api_version`` (``v1`` or ``group/version``), its ``plural``."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    field_selector: str | None = None
    """Only the objects the API server selects by it (e.g. a Secret's ``type``): lists and watches."""

    def path(self, namespace: str | None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"


class ApiError(Exception):
    """A failed request (``status`` 0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Expired(ApiError):
    """410 Gone: the resourceVersion is older than the server's history; list again."""


class KubeClient:
    def __init__(self, api: ApiClient) -> None:
        self._api = api

    @classmethod
    async def connect(cls, *, kubeconfig: str | None = None, context: str | None = None,
                      host: str | None = None) -> KubeClient:
        """``host``: a plain URL (tests); else the kubeconfig (``kubeconfig`` or the default
        locations, ``KUBECONFIG``), else the in-cluster service account."""
        configuration = Configuration()
        if host is not None:
            configuration.host = host
        elif kubeconfig is not None or _has_kubeconfig():
            await kube_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        else:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return cls(ApiClient(configuration))

    async def close(self) -> None:
        await self._api.close()

    async def _get(self, path: str, query: list[tuple[str, str]], timeout_s: float | None) -> Any:
        return await self._call("GET", path, query, timeout_s)

    async def _call(
        self, method: str, path: str, query: list[tuple[str, str]], timeout_s: float | None,
        body: JsonDict | None = None, content_type: str = "application/json",
    ) -> Any:
        """The streaming response of a successful request; ApiError (Expired for 410) otherwise."""
        headers = {"Content-Type": content_type, "Accept": "application/json"} if body is not None else None
        try:
            response = await self._api.call_api(
                path, method, query_params=query, header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout_s,
            )
        except ApiException as exc:
            raise (Expired if exc.status == 410 else ApiError)(int(exc.status or 0), str(exc.reason)) from exc
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:  # (a dropped connection: not an OSError)
            raise ApiError(0, str(exc) or type(exc).__name__) from exc
        status = int(getattr(response, "status", 200))
        if status >= 400:  # not raised by the library when the body is not preloaded
            try:
                text = (await response.read()).decode(errors="replace")
            finally:
                response.release()
            raise (Expired if status == 410 else ApiError)(status, text[:300])
        return response

    async def _json(self, method: str, path: str, body: JsonDict | None = None,
                    content_type: str = "application/json") -> JsonDict:
        response = await self._call(method, path, [], 30.0, body, content_type)
        try:
            answer: JsonDict = json.loads(await response.read())
            return answer
        except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as exc:  # (cut off, or not JSON)
            raise ApiError(0, str(exc) or type(exc).__name__) from exc
        finally:
            response.release()

    async def get(self, spec: KindSpec, namespace: str | None, name: str) -> JsonDict:
        return await self._json("GET", f"{spec.path(namespace)}/{name}")

    async def create(self, spec: KindSpec, namespace: str | None, obj: JsonDict) -> JsonDict:
        return await self._json("POST", spec.path(namespace), obj)

    async def replace(self, spec: KindSpec, namespace: str | None, name: str, obj: JsonDict) -> JsonDict:
        """PUT: fails with 409 when ``obj``'s resourceVersion is not the stored one."""
        return await self._json("PUT", f"{spec.path(namespace)}/{name}", obj)

    async def patch_status(
        self, spec: KindSpec, namespace: str | None, name: str, status: JsonDict
    ) -> JsonDict:
        """A JSON merge patch of the status subresource (``status`` only; the generation stays)."""
        return await self._json("PATCH", f"{spec.path(namespace)}/{name}/status", {"status": status},
                                "application/merge-patch+json")

    async def list(self, spec: KindSpec, namespace: str | None) -> tuple[list[JsonDict], str]:
        """Every object of ``spec`` (``apiVersion`` and ``kind`` set on each) and the list's
        resourceVersion."""
        selector = [("fieldSelector", spec.field_selector)] if spec.field_selector else []
        response = await self._get(spec.path(namespace), selector, 30.0)
        try:
            body = json.loads(await response.read())
        finally:
            response.release()
        typed = {"apiVersion": spec.api_version, "kind": spec.kind}
        items = [{**typed, **item} for item in body.get("items", [])]
        return items, str(body.get("metadata", {}).get("resourceVersion", ""))

    async def watch(
        self, spec: KindSpec, namespace: str | None, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[JsonDict]:
        """Watch events after ``resource_version`` (with bookmarks) until the server ends the watch;
        raises :class:`Expired` on 410, :class:`ApiError` on other failures."""
        query = [
            ("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        if spec.field_selector:
            query.append(("fieldSelector", spec.field_selector))
        response = await self._get(spec.path(namespace), query, timeout_s + 30.0)
        try:
            async for raw in response.content:
                if not raw.strip():
                    continue
                event = json.loads(raw)
                if event.get("type") == "ERROR":
                    status = event.get("object", {})
                    code = int(status.get("code", 0))
                    raise (Expired if code == 410 else ApiError)(code, str(status.get("message", "")))
                yield event
        except (OSError, TimeoutError) as exc:
            raise ApiError(0, str(exc) or type(exc).__name__) from exc
        finally:
            response.release()


def _has_kubeconfig() -> bool:
    paths = [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return any(p.exists() for p in paths) or (Path.home() / ".kube" / "config").exists()


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace(service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace this process runs in: ``POD_NAMESPACE`` (the downward API), else the mounted
    service account's, else None (outside a cluster)."""
    from_env = os.environ.get("POD_NAMESPACE", "").strip()
    if from_env:
        return from_env
    try:
        return service_account_file.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
