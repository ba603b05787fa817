"""What translation needs besides the validated configuration: where the picker is, limits, timeouts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kvgate.gateway.controlplane.downstream import DownstreamSettings
from kvgate.gateway.controlplane.envoy_config import ONE_PASS, ExtProcSettings
from kvgate.gateway.controlplane.translate.tracing import EnvoyTracing

BodyRouting = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class TranslationSettings:
    """``picker_addresses``: ``ip:port`` of kvgate's picker processes (the ext_proc cluster).

    ``listen_ports``: ``(gateway listener port, port Envoy binds)`` pairs; a port not listed binds
    as written in the Gateway. ``body_based_routing``: "auto" emits the body-based-router filter on
    a listener only when one of its routes matches on ``X-Gateway-Model-Name``; "on"/"off" force it.
    ``default_route_timeout_s``: the route timeout when a rule sets none (0 = none: Envoy's own
    default of 15 s would cut long generations). ``ext_proc``: the picker's processing mode, kvgate's
    one-pass data path unless set (``gateway.controlplane.envoy_config.ONE_PASS``).
    """

    picker_addresses: tuple[str, ...]
    listen_host: str = "127.0.0.1"
    listen_ports: tuple[tuple[int, int], ...] = ()
    node_id: str = "kvgate"
    ext_proc: ExtProcSettings = ONE_PASS
    body_based_routing: BodyRouting = "auto"
    bbr_failure_mode_allow: bool = True
    bbr_message_timeout_s: float = 5.0
    default_route_timeout_s: float = 0.0
    downstream: DownstreamSettings = field(default_factory=DownstreamSettings)
    """Timeouts and limits of the clients' connections and requests (``gateway.controlplane.downstream``)."""
    endpoint_fallbacks: bool = True
    """Pools of kvgate's own picker: clusters of their replicas that follow the picker's ranked list
    (``envoy_config.pool_override_cluster``) and routes that retry on the next endpoint; False: the
    ORIGINAL_DST cluster of GIE's reference configuration (one endpoint, no retries)."""
    pool_retries: int = 2
    """Retries of a request that has not started its response (``envoy_config.pool_retry_policy``)."""
    stream_idle_retry_s: float = 30.0
    """A streamed request (the picker marks it) whose replica sends nothing for this long is retried
    on the next endpoint (``envoy_config.stream_retry_policy``); 0: no such bound."""

    outcome_addresses: tuple[str, ...] = ()
    """``ip:port`` of the pickers' outcome-report ports (with ``ext_proc.outcome_reports``)."""

    models_address: str | None = None
    """``ip:port`` of kvgate's models server: every virtual host answers ``GET /v1/models`` from it
    (``gateway.controlplane.translate.models``); None: no such routes."""

    tracing: EnvoyTracing | None = None
    """Envoy's OpenTelemetry tracing (``gateway.controlplane.translate.tracing``); None: off."""

    def __post_init__(self) -> None:
        if not self.picker_addresses:
            raise ValueError("translation needs at least one picker address")

    def bind_port(self, port: int) -> int:
        return dict(self.listen_ports).get(port, port)
