"""What a pool's ready replicas serve, from their ``/v1/models`` polls and their metrics pages."""

from __future__ import annotations

from aiohttp import web

from kvgate.gateway.picker.replica_models import (
    NAMES_REFRESH_S,
    ReplicaModels,
    ReportedModel,
    pool_model_names,
    pool_models,
)
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointSnapshot, EndpointView


def view(address: str, healthy: bool = True, loras: frozenset[str] = frozenset()) -> EndpointView:
    metrics = EndpointMetrics(served_models=frozenset({"base"}), active_loras=loras, updated_at=1.0)
    return EndpointView(Endpoint(address, "p"), metrics, healthy)


def test_reports_merge_polled_and_scraped_models_of_ready_replicas_only() -> None:
    snapshot = EndpointSnapshot.of({"p": (
        view("10.0.0.1:8000", True, frozenset({"fresh-lora"})),
        view("10.0.0.2:8000", False, frozenset({"gone-lora"})),
    )})
    polled = {
        "10.0.0.1:8000": (ReportedModel("base", {"root": "/models/base"}),),
        "10.0.0.2:8000": (ReportedModel("stale", {}),),
    }
    report = pool_models(snapshot, polled)["p"]
    assert report.ready_replicas == 1
    assert [(m.id, dict(m.card)) for m in report.models] == [
        ("base", {"root": "/models/base"}),  # polled wins over scraped
        ("fresh-lora", {"parent": "base"}),  # loaded since the last poll: from the metrics page
    ]


def test_names_are_complete_only_once_every_ready_replica_was_polled() -> None:
    snapshot = EndpointSnapshot.of({"p": (view("10.0.0.1:8000"), view("10.0.0.2:8000")),
                                    "empty": ()})
    one = {"10.0.0.1:8000": (ReportedModel("base"), ReportedModel("sql-lora"))}
    names = pool_model_names(snapshot, one)
    assert names["p"].names == {"base", "sql-lora"}
    assert not names["p"].complete  # 10.0.0.2 has not said what it serves
    both = {**one, "10.0.0.2:8000": (ReportedModel("base"),)}
    assert pool_model_names(snapshot, both)["p"].complete
    assert not pool_model_names(snapshot, both)["empty"].complete  # no ready replica: nothing known


async def test_the_poller_answers_names_from_live_polls_and_follows_changes() -> None:
    served = {"data": [{"id": "base", "object": "model"}]}

    async def models(_: web.Request) -> web.Response:
        return web.json_response(served)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    snapshot = EndpointSnapshot.of({"p": (view(f"127.0.0.1:{port}"),)})
    poller = ReplicaModels(lambda: snapshot, interval=0.0)
    try:
        assert not poller.names("p").complete
        await poller.poll_due(0.0)
        assert poller.names("p").names == {"base"}
        assert poller.names("p").complete
        served["data"].append({"id": "new-lora", "object": "model"})
        await poller.poll_due(1.0)
        assert "new-lora" in poller.names("p").names  # a changed poll is seen though the snapshot is not new
    finally:
        await poller.stop()
        await runner.cleanup()


def test_names_follow_new_views_within_the_refresh_and_at_once_when_asked_fresh() -> None:
    now = [0.0]
    views = {"p": (view("10.0.0.1:8000"),)}
    poller = ReplicaModels(lambda: EndpointSnapshot.of(views), clock=lambda: now[0])
    assert poller.names("p").names == {"base"}
    views["p"] = (view("10.0.0.1:8000", loras=frozenset({"fresh-lora"})),)  # a new snapshot per scrape tick
    now[0] += NAMES_REFRESH_S / 2
    assert poller.names("p").names == {"base"}  # not computed again per snapshot
    assert poller.names("p", fresh=True).names == {"base", "fresh-lora"}  # before a name is called unserved
    views["p"] = (view("10.0.0.1:8000"),)
    now[0] += NAMES_REFRESH_S
    assert poller.names("p").names == {"base"}
