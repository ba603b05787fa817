"""Who may read the picker's metrics: the API server decides, as for the Inference Extension's
picker (``--metrics-endpoint-auth``, the usual kube-rbac-proxy way): a TokenReview says whose the
bearer token is, a SubjectAccessReview whether that user may ``get`` the non-resource URL
``/metrics``. Answers are cached for ``ttl_s`` so a scraper every few seconds costs the API server
little; an API error denies (and is logged)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from kvgate.gateway.controlplane.kubernetes.client import ApiError, KindSpec, KubeClient

log = logging.getLogger(__name__)

TOKEN_REVIEW = KindSpec("authentication.k8s.io/v1", "TokenReview", "tokenreviews", namespaced=False)
ACCESS_REVIEW = KindSpec("authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews",
                         namespaced=False)


class MetricsAuthorizer:
    def __init__(self, client: KubeClient, *, path: str = "/metrics", ttl_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._path = path
        self._ttl = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[bool, float]] = {}

    async def __call__(self, token: str | None) -> bool:
        if not token:
            return False
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None and self._clock() - cached[1] < self._ttl:
            return cached[0]
        allowed = await self._review(token)
        self._cache[key] = (allowed, self._clock())
        return allowed

    async def _review(self, token: str) -> bool:
        try:
            review: dict[str, Any] = await self._client.create(TOKEN_REVIEW, None, {
                "apiVersion": TOKEN_REVIEW.api_version, "kind": TOKEN_REVIEW.kind, "spec": {"token": token},
            })
            status = review.get("status") or {}
            if not status.get("authenticated"):
                return False
            user = status.get("user") or {}
            access = await self._client.create(ACCESS_REVIEW, None, {
                "apiVersion": ACCESS_REVIEW.api_version, "kind": ACCESS_REVIEW.kind,
                "spec": {"user": user.get("username", ""), "groups": user.get("groups", []),
                         "uid": user.get("uid", ""),
                         "nonResourceAttributes": {"path": self._path, "verb": "get"}},
            })
        except ApiError as exc:
            log.warning("metrics authorization failed: %s", exc)
            return False
        return bool((access.get("status") or {}).get("allowed"))
