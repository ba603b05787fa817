"""What ``GET /v1/models`` lists for a listener port (pure: configuration + reports in)."""

from __future__ import annotations

from pathlib import Path

from kvgate.gateway.controlplane.models.catalog import ModelEntry, catalog, model_list, model_object
from kvgate.gateway.controlplane.resources import load_directory, validate
from kvgate.gateway.picker.replica_models import PoolModels, ReportedModel
from tests.gateway.controlplane.resources.manifests import (
    EPP_SERVICE,
    GATEWAY,
    build,
    pool,
    pool_ref,
    route,
)

GOLDEN = Path(__file__).parents[1] / "translate" / "golden"

READY_B = PoolModels(1, (
    ReportedModel("model-b", {"id": "model-b", "owned_by": "vllm", "root": "model-b", "max_model_len": 4096}),
    ReportedModel("model-b-lora", {"id": "model-b-lora", "root": "/adapters/b", "parent": "model-b"}),
    ReportedModel("other-lora", {"id": "other-lora", "root": "/adapters/o", "parent": "model-b"}),
))


def _by_id(entries: tuple[ModelEntry, ...]) -> dict[str, ModelEntry]:
    return {entry.id: entry for entry in entries}


def test_exact_matches_are_declared_and_expressions_filter_what_the_replicas_report() -> None:
    config = validate(load_directory(GOLDEN / "model_routing"))
    entries = _by_id(catalog(config, 8080, {"default/pool-b": READY_B}))
    assert list(entries) == ["model-a", "model-b", "model-b-lora"]  # other-lora: not matched
    assert (entries["model-a"].ready, entries["model-a"].pools) == (False, ("default/pool-a",))
    assert entries["model-b-lora"].ready
    lora = model_object(entries["model-b-lora"], created=7)
    assert (lora["root"], lora["parent"], lora["created"]) == ("/adapters/b", "model-b", 7)
    declared = model_object(entries["model-a"], created=7)
    assert declared == {
        "id": "model-a", "object": "model", "created": 7, "owned_by": "kvgate", "root": "model-a",
        "parent": None, "kvgate": {"ready": False, "pools": ["default/pool-a"]},
    }


def test_a_port_without_routes_lists_nothing_and_a_pool_without_ready_replicas_offers_nothing() -> None:
    config = validate(load_directory(GOLDEN / "model_routing"))
    assert catalog(config, 9999, {"default/pool-b": READY_B}) == ()
    names = [e.id for e in catalog(config, 8080, {"default/pool-b": PoolModels(0, READY_B.models)})]
    assert names == ["model-a"]  # only the declared one


ALIAS = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: alias}
spec:
  poolRef: {name: pool}
  rules:
    - matches: [{model: {value: chat}}]
      targets: [{modelRewrite: base}]
"""


def test_a_pool_routed_without_a_model_match_lists_its_replicas_models_and_rewrite_sources() -> None:
    every_model = route("all", f"    - backendRefs: [{pool_ref('pool')}]")
    config = build(GATEWAY, EPP_SERVICE, pool("pool"), every_model, ALIAS)
    reported = {"default/pool": PoolModels(2, (ReportedModel("base", {"owned_by": "vllm"}),))}
    body = model_list(catalog(config, 8080, reported), created=1)
    assert [item["id"] for item in body["data"]] == ["base", "chat"]
    assert [item["owned_by"] for item in body["data"]] == ["vllm", "kvgate"]
