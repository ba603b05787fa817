"""Manifests in, one immutable :class:`ResourceSet` out.

``parse_manifests`` is the sans-IO core (``(source, text)`` pairs in); ``load_directory`` reads a
directory as ``kubectl apply -R -f DIR`` would: every ``*.yaml`` / ``*.yml`` below it, each a
stream of ``---``-separated documents; ``kind: List`` (and ``*List`` kinds from ``kubectl get -o
yaml``) is expanded. Kinds kvgate does not use are skipped with a note.

Errors that ``kubectl apply`` would refuse (YAML syntax, schema, duplicates) make the whole load
fail with a :class:`ManifestError` naming each file and document index, so a provider can keep
its last good snapshot. Errors a controller reports (dangling references…) are not found here;
``validate`` turns them into status conditions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from kvgate.gateway.controlplane.resources.backend_tls_policy import BackendTLSPolicy
from kvgate.gateway.controlplane.resources.core import ConfigMap, Namespace, Pod, Secret, Service
from kvgate.gateway.controlplane.resources.gateway_api import Gateway, HTTPRoute, ReferenceGrant
from kvgate.gateway.controlplane.resources.grpc_route import GRPCRoute
from kvgate.gateway.controlplane.resources.inference import (
    InferenceModelRewrite,
    InferenceObjective,
    InferencePool,
)
from kvgate.gateway.controlplane.resources.meta import Resource, ResourceRef
from kvgate.policies.errors import ConfigError
from kvgate.policies.validation import describe

MANIFEST_SUFFIXES = (".yaml", ".yml")
_R = TypeVar("_R", bound=Resource)

LLM_D_GROUP = "llm-d.ai"
"""llm-d's API group: its InferenceObjectives and InferenceModelRewrites (``llm-d.ai/v1alpha2``), which
win over the Inference Extension's of the same name (``inference.networking.x-k8s.io``), as a
migration from one to the other leaves both for a while."""

_KINDS: Mapping[tuple[str, str], type[Resource]] = MappingProxyType(
    {
        ("gateway.networking.k8s.io/v1", "Gateway"): Gateway,
        ("gateway.networking.k8s.io/v1beta1", "Gateway"): Gateway,
        ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTPRoute,
        ("gateway.networking.k8s.io/v1beta1", "HTTPRoute"): HTTPRoute,
        ("gateway.networking.k8s.io/v1", "GRPCRoute"): GRPCRoute,
        ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant"): ReferenceGrant,
        ("gateway.networking.k8s.io/v1", "ReferenceGrant"): ReferenceGrant,
        ("gateway.networking.k8s.io/v1", "BackendTLSPolicy"): BackendTLSPolicy,
        ("gateway.networking.k8s.io/v1alpha3", "BackendTLSPolicy"): BackendTLSPolicy,
        ("inference.networking.k8s.io/v1", "InferencePool"): InferencePool,
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"): InferenceObjective,
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite"): InferenceModelRewrite,
        # llm-d's router serves them in its own group since its v0.9 (the same schema)
        (f"{LLM_D_GROUP}/v1alpha2", "InferenceObjective"): InferenceObjective,
        (f"{LLM_D_GROUP}/v1alpha2", "InferenceModelRewrite"): InferenceModelRewrite,
        ("v1", "Pod"): Pod,
        ("v1", "Service"): Service,
        ("v1", "Namespace"): Namespace,
        ("v1", "Secret"): Secret,
        ("v1", "ConfigMap"): ConfigMap,
    }
)


_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML was built with it (about 10x faster on large manifest sets)."""


class _KubeYamlLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    """SafeLoader that keeps timestamps as strings, as Kubernetes' YAML-to-JSON does."""


_KubeYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


@dataclass(frozen=True, slots=True)
class ManifestProblem:
    source: str
    document: int
    message: str

    def __str__(self) -> str:
        return f"{self.source} (document {self.document}): {self.message}"


class ManifestError(ConfigError):
    """The manifests cannot be loaded; ``problems`` lists every one found."""

    def __init__(self, problems: Iterable[ManifestProblem]) -> None:
        self.problems = tuple(problems)
        shown = "; ".join(str(problem) for problem in self.problems[:10])
        more = f" (and {len(self.problems) - 10} more)" if len(self.problems) > 10 else ""
        super().__init__(f"invalid manifests: {shown}{more}")


@dataclass(frozen=True, slots=True)
class ResourceSet:
    """Every object kvgate uses from one load, by kind, in load order. Immutable."""

    gateways: tuple[Gateway, ...] = ()
    http_routes: tuple[HTTPRoute, ...] = ()
    grpc_routes: tuple[GRPCRoute, ...] = ()
    inference_pools: tuple[InferencePool, ...] = ()
    objectives: tuple[InferenceObjective, ...] = ()
    rewrites: tuple[InferenceModelRewrite, ...] = ()
    pods: tuple[Pod, ...] = ()
    services: tuple[Service, ...] = ()
    namespaces: tuple[Namespace, ...] = ()
    reference_grants: tuple[ReferenceGrant, ...] = ()
    secrets: tuple[Secret, ...] = ()
    backend_tls_policies: tuple[BackendTLSPolicy, ...] = ()
    config_maps: tuple[ConfigMap, ...] = ()
    notes: tuple[str, ...] = ()
    sources: Mapping[ResourceRef, str] = field(default_factory=lambda: MappingProxyType({}))
    content_hash: str = ""


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"not valid YAML{where}: {problem}"


def _expand(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        for item in doc["items"]:
            if isinstance(item, dict):
                yield from _expand(item)
            else:
                raise ValueError("a List item is not a mapping")
        return
    yield doc


def _documents(source: str, text: str, problems: list[ManifestProblem]) -> Iterator[tuple[int, Any]]:
    try:
        docs = list(yaml.load_all(text, Loader=_KubeYamlLoader))
    except yaml.YAMLError as exc:
        problems.append(ManifestProblem(source, 0, _yaml_error(exc)))
        return
    yield from enumerate(docs)


def _by_kind(items: list[Resource]) -> dict[type[Resource], list[Resource]]:
    grouped: dict[type[Resource], list[Resource]] = {}
    for item in items:
        grouped.setdefault(type(item), []).append(item)
    return grouped


def _typed(grouped: dict[type[Resource], list[Resource]], cls: type[_R]) -> tuple[_R, ...]:
    return tuple(item for item in grouped.get(cls, []) if isinstance(item, cls))


def parse_manifests(files: Iterable[tuple[str, str]]) -> ResourceSet:
    """Parse ``(source, text)`` pairs into a ResourceSet; raise ManifestError on any problem."""
    problems: list[ManifestProblem] = []
    notes: list[str] = []
    items: list[Resource] = []
    sources: dict[ResourceRef, str] = {}
    llm_d: set[ResourceRef] = set()
    """Objectives and rewrites read in llm-d's group (:data:`LLM_D_GROUP`)."""
    digest = hashlib.sha256()
    for source, text in files:
        digest.update(source.encode() + b"\0" + text.encode() + b"\0")
        for index, doc in _documents(source, text, problems):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                problems.append(ManifestProblem(source, index, "a document must be a mapping"))
                continue
            try:
                expanded = list(_expand(doc))
            except ValueError as exc:
                problems.append(ManifestProblem(source, index, str(exc)))
                continue
            for raw in expanded:
                api_version, kind = raw.get("apiVersion"), raw.get("kind")
                if not isinstance(api_version, str) or not isinstance(kind, str):
                    problems.append(ManifestProblem(source, index, "apiVersion and kind are required"))
                    continue
                cls = _KINDS.get((api_version, kind))
                if cls is None:
                    notes.append(f"{source} (document {index}): ignored {kind} ({api_version}): not used")
                    continue
                try:
                    item = cls.model_validate(raw)
                except ValidationError as exc:
                    name = (raw.get("metadata") or {}).get("name", "?")
                    message = f"{kind} {name}: {describe(exc)}"
                    problems.append(ManifestProblem(source, index, message))
                    continue
                where = f"{source} (document {index})"
                ours = api_version.startswith(f"{LLM_D_GROUP}/")
                if item.ref in sources and (ours != (item.ref in llm_d)):  # the same name in both groups
                    notes.append(f"{where}: {item.ref} is in both the Inference Extension's group and "
                                 f"{LLM_D_GROUP}: {LLM_D_GROUP}'s is used")
                    if not ours:
                        continue
                    items = [other for other in items if other.ref != item.ref]
                elif item.ref in sources:
                    problems.append(
                        ManifestProblem(source, index, f"{item.ref} is also defined in {sources[item.ref]}")
                    )
                    continue
                if ours:
                    llm_d.add(item.ref)
                sources[item.ref] = where
                items.append(item)
    if problems:
        raise ManifestError(problems)
    grouped = _by_kind(items)
    return ResourceSet(
        gateways=_typed(grouped, Gateway),
        http_routes=_typed(grouped, HTTPRoute),
        grpc_routes=_typed(grouped, GRPCRoute),
        inference_pools=_typed(grouped, InferencePool),
        objectives=_typed(grouped, InferenceObjective),
        rewrites=_typed(grouped, InferenceModelRewrite),
        pods=_typed(grouped, Pod),
        services=_typed(grouped, Service),
        namespaces=_typed(grouped, Namespace),
        reference_grants=_typed(grouped, ReferenceGrant),
        secrets=_typed(grouped, Secret),
        backend_tls_policies=_typed(grouped, BackendTLSPolicy),
        config_maps=_typed(grouped, ConfigMap),
        notes=tuple(notes),
        sources=MappingProxyType(sources),
        content_hash=digest.hexdigest()[:16],
    )


def manifest_files(directory: Path) -> list[Path]:
    """The manifest files under ``directory``, sorted, skipping hidden files and folders."""
    if not directory.is_dir():
        raise ConfigError(f"manifest directory {directory} does not exist or is not a directory")
    found = []
    for path in directory.rglob("*"):
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.suffix in MANIFEST_SUFFIXES and path.is_file():
            found.append(path)
    return sorted(found)


def read_manifests(directory: Path) -> list[tuple[str, str]]:
    """``(relative path, text)`` for each manifest file under ``directory``."""
    files = []
    for path in manifest_files(directory):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestError([ManifestProblem(str(path), 0, f"cannot read: {exc}")]) from exc
        files.append((str(path.relative_to(directory)), text))
    return files


def load_directory(directory: Path) -> ResourceSet:
    """Read and parse every manifest under ``directory`` (a single file works too)."""
    if directory.is_file():
        return parse_manifests([(directory.name, directory.read_text(encoding="utf-8"))])
    return parse_manifests(read_manifests(directory))
