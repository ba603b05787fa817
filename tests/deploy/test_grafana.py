"""deploy/grafana: the dashboard is valid Grafana JSON and queries only metrics the picker exports.

The exported names come from a live ``/metrics`` scrape of a PickerService sharing state through a
real redis-server (so the ``kvgate_redis_*`` and ``kvgate_shared_*`` families are there too).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.gateway.controlplane.resources import ProviderStatus, ValidatedConfig, load_directory, validate
from kvgate.gateway.controlplane.telemetry import ControlPlaneCollector
from kvgate.gateway.controlplane.xds import XdsStatus
from kvgate.gateway.picker.metric_aliases import LLM_D_NAMES
from kvgate.gateway.picker.pools_file import PoolSpec
from kvgate.gateway.picker.redis_link import RedisSettings
from kvgate.gateway.picker.service import PickerService, PickerSettings
from kvgate.gateway.up_options import bundled_example
from tests.redis_server import RedisServer

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kvgate-dashboard.json"

_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
     "bool", "inf", "nan", "le"}
)
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count")}


def sample_names(family: str, kind: str) -> tuple[str, ...]:
    """The sample names PromQL sees for one ``# TYPE`` line (the text format names counters with _total)."""
    if kind == "counter":
        return (family if family.endswith("_total") else family + "_total",)
    return tuple(family + suffix for suffix in _SUFFIXES.get(kind, ("",)))


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (function names, labels and keywords left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def test_metric_names_reads_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, pool) (rate(a_seconds_bucket{instance=~"$instance"}'
        "[$__rate_interval]))) / on (pool) group_left sum(b_total) + 1e3 * c and d offset 5m"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c", "d"}
    assert metric_names("max(x{y=\"by (z)\"})") == {"x"}


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query" and isinstance(query, dict):
            match = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query["query"])
            assert match, f"variable {variable['name']}: unexpected query {query['query']!r}"
            yield f"variable {variable['name']}", match.group(1)


def test_dashboard_is_grafana_json_with_a_prometheus_datasource_variable() -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"]
    assert dashboard["title"]
    [source] = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    ids = [panel["id"] for panel in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        if panel["type"] == "text":  # instructions (how to view traces): markdown, no query
            assert panel["options"]["mode"] == "markdown", panel["title"]
            assert panel["options"]["content"].strip(), panel["title"]
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": f"${{{source['name']}}}"}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


class _ExampleControlPlane:
    """The control plane's state the collector reads, for the bundled example's manifests."""

    def __init__(self) -> None:
        self.config: ValidatedConfig | None = validate(load_directory(bundled_example()))
        self.last_error: str | None = None

    def provider_status(self) -> ProviderStatus:
        return ProviderStatus("example", 1, "", None, None, None)


async def _exported_families(redis: RedisServer) -> dict[str, str]:
    """``# TYPE`` lines of a live picker's /metrics: family name → type."""
    service = PickerService(
        PickerSettings(grpc_address="127.0.0.1:0", admin_port=0, redis=RedisSettings(url=redis.url))
    )
    service.apply_pools([PoolSpec(name="llama", endpoints=("127.0.0.1:9",))], "llama")
    # kvgate up registers the control plane's families on the same registry (its /metrics)
    service.telemetry.registry.register(ControlPlaneCollector(_ExampleControlPlane(), XdsStatus()))
    await service.start()
    try:
        url = f"http://127.0.0.1:{service.admin.port}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            assert response.status == 200
            text = await response.text()
    finally:
        await service.stop()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))


async def test_dashboard_queries_only_and_all_metrics_the_picker_exports(redis_server: RedisServer) -> None:
    families = await _exported_families(redis_server)
    for expected in ("inference_objective_request_total", "kvgate_redis_connected", "kvgate_shared_peers"):
        assert expected in families, f"{expected} missing from /metrics: {sorted(families)}"
    exported = {name for family, kind in families.items() for name in sample_names(family, kind)}

    used: dict[str, set[str]] = {}
    for where, expr in _exprs(_dashboard()):
        for name in metric_names(expr):
            used.setdefault(name, set()).add(where)
    unknown = {name: sorted(places) for name, places in used.items() if name not in exported}
    assert not unknown, f"the dashboard queries metrics the picker does not export: {unknown}"

    # llm-d's names for the Inference Extension's families (metric_aliases) are copies: the panels
    # show the originals; each copy's original is exported
    copies = {f for f in families if f.startswith("llm_d_epp_")}
    originals = {llm_d: gie for gie, names in LLM_D_NAMES.items() for llm_d in names}
    for copy in copies:
        original = originals[copy.removesuffix("_total")]
        assert original in families or f"{original}_total" in families, copy
    unused = sorted(f for f, kind in families.items()
                    if f not in copies and not any(n in used for n in sample_names(f, kind)))
    assert not unused, f"families the picker exports but no panel shows (add a panel): {unused}"
    assert {"llm_d_epp_request_total", "llm_d_epp_request_running", "llm_d_epp_ready_endpoints"} <= copies
