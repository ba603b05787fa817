"""A pool as the picker sees it: which model names it knows, serves, or cannot tell."""

from __future__ import annotations

import pytest

from kvgate.gateway.picker.pool_runtime import PoolRuntime, with_spill_chains
from kvgate.gateway.picker.pools_file import FlowControlSpec, PoolSpec
from kvgate.gateway.picker.replica_models import PoolModelNames
from kvgate.gateway.picker.service import PickerService, PickerSettings


def runtime(reported: PoolModelNames, **spec: object) -> PoolRuntime:
    pool = PoolSpec.model_validate({"name": "p"} | spec)
    return PoolRuntime.of(pool, None, None, lambda name, fresh: reported)  # type: ignore[arg-type]


SERVED = PoolModelNames(frozenset({"base", "sql-lora"}), complete=True)
PARTIAL = PoolModelNames(frozenset({"base"}), complete=False)


def test_what_the_replicas_serve_is_known_and_the_rest_is_not_once_all_have_said() -> None:
    pool = runtime(SERVED)
    assert pool.model_known("sql-lora") is True
    assert pool.model_known("other") is False


def test_a_pool_cannot_tell_until_every_ready_replica_has_said() -> None:
    assert runtime(PARTIAL).model_known("other") is None
    assert runtime(PoolModelNames()).model_known("other") is None  # no ready replica


def test_configured_names_are_known_before_any_replica_reports() -> None:
    pool = runtime(
        PoolModelNames(),
        routeModels=["routed"],
        modelRewrites=[{"models": ["alias"], "targets": [{"model": "target"}]}],
    )
    for name in ("routed", "alias", "target"):
        assert pool.model_known(name) is True, name


def test_a_declared_model_list_is_the_whole_list() -> None:
    pool = runtime(PoolModelNames(), models=["m"])
    assert pool.model_known("m") is True
    assert pool.model_known("x") is False


def test_a_pool_that_forwards_unknown_names_never_refuses_one() -> None:
    pool = runtime(SERVED, checkModels=False)
    assert pool.model_known("base") is True
    assert pool.model_known("loaded-on-first-use") is None


def test_spill_chains_link_each_pool_to_the_next_and_stop_before_a_pool_passed() -> None:
    def pool(name: str, spill_to: str | None) -> PoolRuntime:
        return runtime(SERVED, name=name, **({"spillTo": spill_to} if spill_to else {}))

    chained = with_spill_chains({"a": pool("a", "b"), "b": pool("b", "c"), "c": pool("c", None)})
    a = chained["a"]
    assert a.fallback is not None
    assert a.fallback.name == "b"
    assert a.fallback.fallback is not None
    assert a.fallback.fallback.name == "c"
    assert a.fallback.fallback.fallback is None
    looped = with_spill_chains({"a": pool("a", "b"), "b": pool("b", "a")})
    assert looped["a"].fallback is not None
    assert looped["a"].fallback.fallback is None  # b's own spill (to a) is not followed back
    assert looped["b"].fallback is not None
    assert looped["b"].fallback.name == "a"


async def test_a_configuration_change_keeps_the_pools_holding_area_and_its_held_requests() -> None:
    service = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0))
    first = PoolSpec.model_validate({"name": "p", "endpoints": ["127.0.0.1:9"],
                                     "flowControl": {"maxQueueLength": 10}})
    service.apply_pools([first], "p")
    area = service.table.pools["p"].holding_area
    assert area is not None
    changed = first.model_copy(update={"flow_control": FlowControlSpec.model_validate(
        {"maxQueueLength": 3, "queueTimeoutSeconds": 5})})
    service.apply_pools([changed], "p")
    kept = service.table.pools["p"].holding_area
    assert kept is area
    assert (kept.settings.max_queue_length, kept.timeout_s) == (3, 5)
    service.apply_pools([first.model_copy(update={"flow_control": None})], "p")
    assert service.table.pools["p"].holding_area is None


async def test_a_pool_without_endpoints_is_said_once_as_it_becomes_empty(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0))
    empty = PoolSpec(name="p")
    service.apply_pools([empty], "p")
    service.apply_pools([empty], "p")  # still empty: not said again
    service.apply_pools([PoolSpec(name="p", endpoints=("127.0.0.1:9",))], "p")
    service.apply_pools([empty], "p")  # empty again
    said = [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and "no endpoints" in r.getMessage()]
    assert said == ["pool p has no endpoints: its requests are answered 503 until one is ready"] * 2
