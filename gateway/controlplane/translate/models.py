"""The ``/v1/models`` routes: ``GET /v1/models`` and ``GET /v1/models/{id}`` go to kvgate's models
server (:mod:`gateway.controlplane.models.server`), first in every virtual host, with the picker and the
body-based router off (no body, no pool, no replica). The route names the Gateway listener port in
``x-kvgate-listener-port`` (a client's copy is overwritten)."""

from __future__ import annotations

from typing import Any

from kvgate.extproc.names import LISTENER_PORT_HEADER
from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.translate.backends import PER_ROUTE_TYPE, static_cluster
from kvgate.gateway.controlplane.translate.names import BBR_FILTER

JsonDict = dict[str, Any]

MODELS_CLUSTER = "kvgate_models"

_OFF = {"@type": PER_ROUTE_TYPE, "disabled": True}


def models_cluster(address: str) -> JsonDict:
    return static_cluster(MODELS_CLUSTER, (address,))


def models_routes(port: int) -> list[JsonDict]:
    get = {"name": ":method", "string_match": {"exact": "GET"}}
    action = {
        "route": {"cluster": MODELS_CLUSTER, "timeout": ec.duration(5.0)},
        "request_headers_to_add": [{
            "header": {"key": LISTENER_PORT_HEADER, "value": str(port)},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }],
        "typed_per_filter_config": {ec.EXT_PROC_FILTER: _OFF, BBR_FILTER: _OFF},
    }
    return [
        {"name": "kvgate/models", "match": {"path": "/v1/models", "headers": [get]}, **action},
        {"name": "kvgate/model", "match": {"prefix": "/v1/models/", "headers": [get]}, **action},
    ]
