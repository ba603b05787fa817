"""Envoy listeners (one per Gateway listener port) and their HTTP filter chains.

Chain: strip system-owned headers → [body-based router] → endpoint-picker ext_proc → router. The
body-based router is a second ext_proc filter to the same picker, its stream marked with gRPC
initial metadata ``x-kvgate-role: bbr``: it reads the buffered body, sets ``X-Gateway-Model-Name``
and clears the route cache, so the endpoint-picker filter and the router see the route chosen by
model (verified with real Envoy). Routes come over RDS (ADS).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.local_replies import cel_filter, openai_local_replies, with_anthropic_twins
from kvgate.gateway.controlplane.translate.cors import cors_filter
from kvgate.gateway.controlplane.translate.names import (
    BBR_FILTER,
    BBR_ROLE,
    INVALID_BACKEND_HEADER,
    ROLE_METADATA_KEY,
    listener_name,
    route_config_name,
)
from kvgate.gateway.controlplane.translate.settings import TranslationSettings
from kvgate.gateway.controlplane.translate.tracing import hcm_tracing, request_id_extension
from kvgate.gateway.controlplane.translate.virtual_hosts import PortListener
from kvgate.gateway.controlplane.xds.bootstrap import ads_config_source

JsonDict = dict[str, Any]

_EXT_PROC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"


def bbr_filter(settings: TranslationSettings) -> JsonDict:
    """The body-based-router ext_proc filter: request headers + BUFFERED body, nothing of the response."""
    return {
        "name": BBR_FILTER,
        "typed_config": {
            "@type": _EXT_PROC_TYPE,
            "grpc_service": {
                "envoy_grpc": {"cluster_name": settings.ext_proc.cluster_name},
                "timeout": ec.duration(settings.ext_proc.grpc_timeout_s),
                "initial_metadata": [{"key": ROLE_METADATA_KEY, "value": BBR_ROLE}],
            },
            "failure_mode_allow": settings.bbr_failure_mode_allow,
            "allow_mode_override": True,  # (a gRPC call's or a WebSocket's body off: extproc.bbr)
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SKIP",
                "request_body_mode": "BUFFERED",
                "response_body_mode": "NONE",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
            "message_timeout": ec.duration(settings.bbr_message_timeout_s),
        },
    }


NO_VALID_BACKEND_ERROR: JsonDict = {"error": {
    "message": "the route's backend reference is not valid (kvgate status says why)",
    "type": "internal_error", "code": "no_valid_backend",
}}
"""The body of the 500 that the Gateway API requires for requests a rule sends to an invalid backend
(an InferencePool or Service that does not exist, a reference no ReferenceGrant allows)."""


def invalid_backend_reply() -> JsonDict:
    """Local-reply mappers: the 503 of a split's invalid-backend share becomes a 500 (Gateway API);
    both it and the 500 of a rule without any valid backend answer in OpenAI's error JSON
    (Anthropic's on its Messages API)."""
    return {
        "mappers": with_anthropic_twins([
            {
                "filter": {
                    "and_filter": {
                        "filters": [
                            {
                                "status_code_filter": {
                                    "comparison": {
                                        "op": "EQ",
                                        "value": {
                                            "default_value": 503,
                                            "runtime_key": "kvgate.invalid_backend",
                                        },
                                    }
                                }
                            },
                            {
                                "header_filter": {
                                    "header": {"name": INVALID_BACKEND_HEADER, "present_match": True}
                                }
                            },
                        ]
                    }
                },
                "status_code": 500,
                "body_format_override": {"json_format": NO_VALID_BACKEND_ERROR},
            },
            {  # a rule with no valid backend at all: its direct response, in the same JSON
                "filter": cel_filter("response.code == 500 && response.code_details == 'direct_response'"),
                "body_format_override": {"json_format": NO_VALID_BACKEND_ERROR},
            },
        ])
    }


def envoy_listener(
    port: int, settings: TranslationSettings, body_routing: bool, on_port: Sequence[PortListener] = (),
    *, cors: bool = False, auth_filters: Sequence[JsonDict] = (),
) -> JsonDict:
    """The listener for Gateway listener ``port`` (bound at ``settings.bind_port(port)``); where the
    Gateway listeners ``on_port`` are HTTPS, Envoy terminates TLS (``tls_filter_chains``); ``cors``:
    a route on it has a CORS policy (Envoy's CORS filter: a preflight is answered there);
    ``auth_filters``: the ext_authz filters its routes use (``translate.external_auth``)."""
    # CORS and ExternalAuth after the body-based router, which holds a request's headers until its
    # body names the model and re-matches the route: they read the final route's settings (CORS
    # before ExternalAuth: a browser's preflight needs no credentials)
    extra = [*([bbr_filter(settings)] if body_routing else []), *([cors_filter()] if cors else []),
             *auth_filters]
    hcm = ec.http_connection_manager(
        listener_name(port), {}, settings.ext_proc, extra, settings.downstream
    )
    config = hcm["typed_config"]
    del config["route_config"]
    config["rds"] = {"route_config_name": route_config_name(port), "config_source": ads_config_source()}
    config["strip_any_host_port"] = True
    if settings.tracing is not None:
        config["tracing"] = hcm_tracing(settings.tracing)
        config["request_id_extension"] = request_id_extension()
    # Mappers apply first-match: the invalid-backend 500 first, then Envoy's own replies as OpenAI
    # JSON (gateway.controlplane.local_replies; the picker's ImmediateResponses stay as they are).
    config["local_reply_config"] = {
        "mappers": [
            *invalid_backend_reply()["mappers"],
            *openai_local_replies(settings.ext_proc.max_body_bytes)["mappers"],
        ]
    }
    listener = ec.listener(
        listener_name(port),
        settings.listen_host,
        settings.bind_port(port),
        hcm,
        settings.ext_proc.max_body_bytes,
    )
    if any(item.certificate is not None for item in on_port):
        listener.update(tls_filter_chains(hcm, on_port))
    return listener


_TLS_INSPECTOR = "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"
_DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


def tls_filter_chains(hcm: JsonDict, on_port: Sequence[PortListener]) -> JsonDict:
    """Listener fields terminating TLS: a filter chain per HTTPS Gateway listener, chosen by the
    client's SNI (``hostname``; a listener without one takes any other name), each with its
    certificate inline (Envoy redacts private keys from its config dump) and the same routes."""
    chains = []
    for item in sorted(on_port, key=lambda item: item.hostname or ""):
        certificate = item.certificate
        if certificate is None:
            continue
        chain: JsonDict = {
            "filters": [hcm],
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": _DOWNSTREAM_TLS,
                    "common_tls_context": {
                        "tls_certificates": [{
                            "certificate_chain": {"inline_string": certificate.certificate_chain},
                            "private_key": {"inline_string": certificate.private_key},
                        }],
                        "alpn_protocols": ["h2", "http/1.1"],
                    },
                },
            },
        }
        if item.hostname is not None:
            chain["filter_chain_match"] = {"server_names": [item.hostname]}
        chains.append(chain)
    inspector = {"name": "envoy.filters.listener.tls_inspector", "typed_config": {"@type": _TLS_INSPECTOR}}
    return {"listener_filters": [inspector], "filter_chains": chains}
