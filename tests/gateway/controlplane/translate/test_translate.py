"""Translation properties beyond the golden files: fast protobuf path, body-based-routing switch, settings."""

from __future__ import annotations

import pytest

from kvgate.gateway.controlplane.translate import BBR_FILTER, TranslationSettings
from kvgate.gateway.controlplane.xds import Snapshot
from tests.gateway.controlplane.translate.golden import CASES, SETTINGS, translate_case


@pytest.mark.parametrize("case", CASES)
def test_fast_snapshot_equals_plain_parse(case: str) -> None:
    resources = translate_case(case)
    plain = Snapshot.from_dicts(
        listeners=resources.listeners, routes=resources.routes, clusters=resources.clusters
    )
    assert resources.snapshot().version == plain.version


def _filters(case: str, mode: str) -> list[str]:
    settings = TranslationSettings(picker_addresses=SETTINGS.picker_addresses, body_based_routing=mode)  # type: ignore[arg-type]
    listener = translate_case(case, settings).listeners[0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return [flt["name"] for flt in hcm["http_filters"]]


def test_body_based_router_only_where_a_route_matches_the_model_header() -> None:
    assert BBR_FILTER in _filters("model_routing", "auto")
    assert BBR_FILTER not in _filters("single_pool", "auto")
    assert BBR_FILTER in _filters("single_pool", "on")
    assert BBR_FILTER not in _filters("model_routing", "off")
    assert _filters("model_routing", "auto").index(BBR_FILTER) < _filters("model_routing", "auto").index(
        "envoy.filters.http.ext_proc"
    )


def test_listen_ports_remap_and_picker_required() -> None:
    settings = TranslationSettings(picker_addresses=SETTINGS.picker_addresses, listen_ports=((8080, 18080),))
    listener = translate_case("single_pool", settings).listeners[0]
    assert listener["address"]["socket_address"]["port_value"] == 18080
    assert listener["name"] == "kvgate_http_8080"
    with pytest.raises(ValueError, match="picker address"):
        TranslationSettings(picker_addresses=())
