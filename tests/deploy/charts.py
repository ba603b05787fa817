"""Render deploy/charts with Helm's own engine (the helm-python-sdk wheel bundles Helm v4's Go SDK)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

CHARTS = Path(__file__).resolve().parents[2] / "deploy" / "charts"
NAMESPACE = "ai"

Doc = dict[str, Any]


def render(chart: str, values: dict[str, Any], release: str = "llama") -> list[Doc]:
    """Every object ``chart`` renders with ``values`` as release ``release`` in NAMESPACE."""
    with helm.Chart.load(CHARTS / chart) as loaded:
        files = loaded.render(values, name=release, namespace=NAMESPACE)
    docs: list[Doc] = []
    for name, text in sorted(files.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(text) if doc]
    assert docs, f"{chart} rendered nothing"
    return docs


def render_error(chart: str, values: dict[str, Any]) -> str:
    with helm.Chart.load(CHARTS / chart) as loaded, pytest.raises(helm.HelmError) as failed:
        loaded.render(values, name="llama", namespace=NAMESPACE)
    return str(failed.value)


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(deployment: Doc, name: str | None = None) -> Doc:
    """The Deployment's container called ``name``; without a name, its main one (the only one, or
    the first: a sidecar comes after it)."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found: list[Doc] = [c for c in containers if name is None or c["name"] == name]
    assert found, f"no container {name}"
    return found[0]
