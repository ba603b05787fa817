"""Header and metadata names of the endpoint-picker protocol (GIE's, plus kvgate's own)."""

from __future__ import annotations

from kvgate.policies.flow_control import QUEUE_TTL_HEADER
from kvgate.policies.latency_objectives import TPOT_SLO_HEADER, TTFT_SLO_HEADER

DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""Request header and ``envoy.lb`` metadata key carrying the pick (``ip:port``, or an ordered comma list)."""

SERVED_KEY = "x-gateway-destination-endpoint-served"
"""``envoy.lb`` metadata key in which the data plane reports the endpoint that actually served."""

SUBSET_KEY = "x-gateway-destination-endpoint-subset"
"""Key of the subset hint inside the ``envoy.lb.subset_hint`` metadata namespace."""
SUBSET_KEYS = ("x-llm-d-router-destination-endpoint-subset", SUBSET_KEY)
SERVED_KEYS = ("x-llm-d-router-destination-endpoint-served", SERVED_KEY)
"""The keys a data plane may send them under, llm-d's router's newer names first (read the same)."""

LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"

MODEL_NAME_HEADER = "x-gateway-model-name"
"""The body's ``model`` copied into a header so that HTTPRoute header matches can select by model."""

MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
"""The Inference Extension picker's per-request model override (llm-d's EPP headers): the model the
replica serves, unless an InferenceModelRewrite rule names one for the request's model. Read by the
picker and not forwarded."""

OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"

HEADER_ALIASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (OBJECTIVE_HEADER, ("x-llm-d-router-inference-objective", "x-llm-d-inference-objective")),
    (FAIRNESS_HEADER, ("x-llm-d-router-inference-fairness-id", "x-llm-d-inference-fairness-id")),
    (MODEL_REWRITE_HEADER, ("x-llm-d-router-model-name-rewrite", "x-llm-d-model-name-rewrite")),
    (TTFT_SLO_HEADER, ("x-llm-d-router-slo-ttft-ms", "x-llm-d-slo-ttft-ms")),
    (TPOT_SLO_HEADER, ("x-llm-d-router-slo-tpot-ms", "x-llm-d-slo-tpot-ms")),
    (QUEUE_TTL_HEADER, ("x-llm-d-router-inference-ttl",)),
)
"""llm-d's names for the request headers above, newest first: its router renamed the Inference
Extension's (``x-llm-d-inference-objective``, then ``x-llm-d-router-inference-objective``), keeping
the older ones as aliases, the newest present winning. The picker reads each under the name above."""
ALIAS_NAMES = frozenset(alias for _, aliases in HEADER_ALIASES for alias in aliases)
REQUEST_ID_HEADER = "x-request-id"
SESSION_HEADER = "x-session-id"

POOL_METADATA_KEY = "x-kvgate-pool"
SESSION_METADATA_KEY = "x-kvgate-session"
"""gRPC initial metadata of a route rule with ``sessionPersistence`` (``extproc.session_persistence``)."""
"""gRPC initial metadata (set by Envoy's per-route ``ExtProcPerRoute`` override) naming the request's pool."""

BACKEND_REQUEST_METADATA_KEY = "x-kvgate-backend-request-ms"
"""gRPC initial metadata (per route, like the pool's) carrying the route rule's HTTPRoute
``timeouts.backendRequest`` in milliseconds: the picker's attempt bound never exceeds it."""

KVGATE_HEADER_PREFIX = "x-kvgate-"

STREAM_HEADER = "x-kvgate-stream"
"""Set to ``1`` by the picker on a streamed request: kvgate's routes give such requests an upstream
idle timeout (a replica that sends nothing is abandoned and the request retried elsewhere), which a
silent non-streamed generation must not get."""

LISTENER_PORT_HEADER = "x-kvgate-listener-port"
"""Set by the ``/v1/models`` routes kvgate writes: the Gateway listener port a request came in on."""

OUTCOME_HEADER = "x-kvgate-outcome"
"""Set by the picker on a request whose response it skips (``skip_unread_responses``) when Envoy
reports outcomes to it (``extproc.outcomes``): the request's pool and labels. Envoy's gRPC access log
logs only requests that carry it, with it."""

PREFILLER_HEADER = "x-prefiller-host-port"
"""The prefill endpoint (``ip:port``) of a disaggregated request, for the decode side's routing
sidecar (llm-d's ``x-prefiller-host-port``); set only when the sidecar runs the prefill
(``pdExecution: sidecar``). System-owned: a client's copy would send its prompt anywhere."""

SYSTEM_OWNED_HEADERS = frozenset({DESTINATION_HEADER, SERVED_KEY, SUBSET_KEY, PREFILLER_HEADER})


def is_system_owned(name: str) -> bool:
    """True for headers only the gateway may set; ``name`` must be lower-case."""
    return name in SYSTEM_OWNED_HEADERS or name.startswith(KVGATE_HEADER_PREFIX)
