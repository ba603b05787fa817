"""The Inference Extension's (now llm-d's) ``EndpointPickerConfig``, the file its charts pass the
picker with ``--config-file`` (or ``--config-text``), as a kvgate scheduling profile (sans-IO).

A drop-in picker should honour the scorer weights and the picker a deployment chose, and the
engines' KV events where it routes on them (llm-d's precise prefix plugin: its ``kvEventsConfig``
becomes the pools' KV-event source, its ``tokenizersPoolConfig`` a hint of where the tokenizer is,
its block size ``engine-prefix-matches``', which every translated profile carries as kvgate's own
profiles do). A config of
one scheduling profile whose plugins kvgate has translates to a profile document
(``policies.profile``), and llm-d's P/D pair (``prefill`` and ``decode`` profiles with a P/D
profile handler and its decider) to a disaggregated one (``policies.disaggregation``: kvgate's
prefix-based decider with the config's threshold, each half from its profile): its scorers with
their weights, its picker, the prefix settings of its
prefix plugins (``blockSizeTokens`` at 4 characters a token, the deprecated ``blockSize`` in
characters, ``maxPrefixBlocksToMatch`` or ``maxPrefixTokensToMatch``, ``lruCapacityPerServer``),
with kvgate's own filters first (a stored response's endpoint, healthy endpoints) and its feedback
plugins. Plugins whose work kvgate does itself in another place (metrics sources and extractors,
request parsers, the single-profile handler, a decode filter in a pool of one role, the prefix
producer; the role filters of a P/D pair) are noted and left out. The saturation detector's
thresholds (its ``saturationDetector`` section, or a ``utilization-detector`` plugin) become the
profile's admission thresholds, which autoscalers such as llm-d's variant autoscaler are aligned
with. Anything else (a latency
predictor, filters kvgate has not) is not translated: the caller keeps its own profile and says why.

The charts pass their default config to every picker: :func:`is_reference_default` tells it
(GIE's default scorers and weights, the max-score picker, default prefix settings), which asks for
nothing but the picker's default behaviour, and kvgate's default profile routes better than it
(bench/results/README.md): the caller keeps kvgate's default for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvgate.policies.durations import go_duration

KINDS = ("EndpointPickerConfig",)
SCORERS: Mapping[str, str] = {
    "queue-scorer": "queue-scorer",
    "kv-cache-utilization-scorer": "kv-cache-utilization-scorer",
    "prefix-cache-scorer": "prefix-cache-scorer",
    # (its matches come from the engines' KV events: engine-prefix-matches, in every translation)
    "precise-prefix-cache-scorer": "prefix-cache-scorer",
    "lora-affinity-scorer": "lora-affinity-scorer",
    "session-affinity-scorer": "session-affinity-scorer",
    "running-requests-size-scorer": "running-requests-scorer",
    "active-request-scorer": "inflight-requests-scorer",
    # llm-d's: 0.5 for an empty queue, falling to 0 at its threshold; kvgate's queue scorer prefers
    # the shorter queues too, relative to the pool's (said where used)
    "load-aware-scorer": "queue-scorer",
}
"""Their scorer types → kvgate's of the same meaning."""
PICKERS = frozenset({"max-score-picker", "random-picker", "weighted-random-picker"})
DONE_ELSEWHERE: Mapping[str, str] = {
    "single-profile-handler": "one profile is what kvgate runs",
    "metrics-data-source": "kvgate scrapes the model servers itself",
    "core-metrics-extractor": "kvgate reads the engines' metrics itself",
    "models-data-source": "kvgate polls /v1/models itself",
    "models-data-extractor": "kvgate polls /v1/models itself",
    "openai-parser": "kvgate parses the OpenAI APIs itself",
    "approx-prefix-cache-producer": "kvgate's prefix index (its parameters are kept)",
    "inflight-load-producer": "kvgate counts its requests in flight itself",
    "decode-filter": "a pool of one role (kvgate's P/D pools use the pd profiles)",
    "utilization-detector": "kvgate's admission thresholds (its thresholds are kept)",
    "concurrency-detector": "kvgate's admission thresholds",
    "precise-prefix-cache-producer": "kvgate follows the engines' KV events itself (its settings are kept)",
    "token-producer": "kvgate tokenizes with the model's tokenizer files itself",
    "tokenizer": "kvgate tokenizes with the model's tokenizer files itself",
    "endpoint-notification-source": "kvgate follows the pool's endpoints itself",
    "no-hit-lru-scorer": "kvgate spreads requests no endpoint caches by their load, ties at random",
}
_PREFIX_PLUGINS = ("prefix-cache-scorer", "approx-prefix-cache-producer")
_PRECISE_PLUGINS = ("precise-prefix-cache-scorer", "precise-prefix-cache-producer")
_TOKENIZER_PLUGINS = ("token-producer", "tokenizer")
DEFAULT_KV_EVENTS_PORT = 5557
"""llm-d's ``podDiscoveryConfig.socketPort`` default: where each engine publishes."""
FEEDBACK = ("engine-prefix-matches", "inflight-recorder", "prefix-index-recorder", "session-recorder",
            "stored-response-recorder", "outlier-ejection")
"""A translated profile's feedback: kvgate's default profile's (``engine-prefix-matches`` routes on
the engines' KV events where the pool follows them, and does nothing elsewhere)."""
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class KvEventsSource:
    """Where the precise prefix plugin's ``kvEventsConfig`` has the engines' KV events come from:
    each Pod's publisher at ``port`` (``discoverPods``), or the picker's own socket at ``bind``
    (``zmqEndpoint``, the engines connecting to it). One of the two."""

    port: int | None = None
    bind: str | None = None


@dataclass(frozen=True, slots=True)
class TokenizerHint:
    """The precise plugin's tokenizer, as llm-d's ``tokenizersPoolConfig`` names it: the model, and
    where its ``tokenizer.json`` is on the picker's disk (``local``: a map from model to file, or a
    directory to look in). The caller looks (this module does no IO)."""

    model: str | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    directory: str | None = None
    file_name: str = "tokenizer.json"


@dataclass(frozen=True, slots=True)
class Translation:
    profile: Mapping[str, Any] | None
    """A profile document (``policies.profile.build_profile`` builds it; a disaggregated one,
    ``policies.disaggregation``, names its halves by role: the caller writes :attr:`halves` where
    it names them), or None: not translated."""
    notes: tuple[str, ...] = field(default=())
    """What was left out, or why nothing was translated."""
    halves: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """A disaggregated profile's ``decode`` and ``prefill`` profile documents."""
    kv_events: KvEventsSource | None = None
    """The precise prefix plugin's KV-event source, for the pools that name none."""
    tokenizer: TokenizerHint | None = None
    """The precise plugin's (or a tokenizer plugin's) tokenizer, for the pools that name none."""
    flow_control: Mapping[str, Any] | None = None
    """The pools' flow control (a pools file's ``flowControl`` fields) where the config turns llm-d's
    on (its ``flowControl`` feature gate), for the pools that name none; None: off."""
    admission: Mapping[str, float] = field(default_factory=dict)
    """The saturation detector's thresholds as a profile's ``admission`` (also where the scheduling
    profiles are not translated: kvgate's default profile then admits at them)."""


_HANDLERS = frozenset({"pd-profile-handler", "disagg-profile-handler"})
_DECIDERS = frozenset({"prefix-based-pd-decider", "always-disagg-pd-decider"})
_ROLE_FILTERS = frozenset({"prefill-filter", "decode-filter"})


class _Untranslatable(Exception):
    pass


def translate_epp_config(text: str) -> Translation:
    """``text`` (an EndpointPickerConfig's YAML) as a kvgate profile document, or why not."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return Translation(None, (f"not valid YAML: {exc}",))
    if not isinstance(document, Mapping) or document.get("kind") not in KINDS:
        return Translation(None, ("not an EndpointPickerConfig (kind)",))
    try:
        return _translate(document)
    except _Untranslatable as why:
        return Translation(None, (str(why),))


def _translate(document: Mapping[str, Any]) -> Translation:
    plugins: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for spec in document.get("plugins") or ():
        if not isinstance(spec, Mapping) or not isinstance(spec.get("type"), str):
            raise _Untranslatable("a plugin without a type")
        parameters = spec.get("parameters") or {}
        plugins[str(spec.get("name") or spec["type"])] = (spec["type"], parameters)
    notes: list[str] = []
    # what applies to the pools whatever becomes of the scheduling profiles (KV events, flow control)
    block_size, source = _precise(plugins, notes)
    tokenizer = _tokenizer(plugins)
    admission = _admission(document, plugins, notes)
    flow = _flow_control(document, admission, notes)
    try:
        return _scheduling(document, plugins, notes, block_size, admission,
                           kv_events=source, tokenizer=tokenizer, flow_control=flow)
    except _Untranslatable as why:
        return Translation(None, (*notes, str(why)), kv_events=source, tokenizer=tokenizer,
                           flow_control=flow, admission=admission)


def _scheduling(document: Mapping[str, Any], plugins: Mapping[str, tuple[str, Mapping[str, Any]]],
                notes: list[str], block_size: int | None, admission: Mapping[str, float],
                **pool_level: Any) -> Translation:
    """The scheduling profiles' translation (``pool_level``: the Translation's fields for the pools);
    raises _Untranslatable."""
    found = document.get("schedulingProfiles")
    profiles: dict[str, Mapping[str, Any]] = {
        str(p.get("name")): p for p in (found if isinstance(found, list) else []) if isinstance(p, Mapping)}
    handler = next((kind for kind, _ in plugins.values() if kind in _HANDLERS), None)
    disaggregated = handler is not None and set(profiles) == {"prefill", "decode"}
    if len(profiles) != 1 and not disaggregated:
        raise _Untranslatable(f"{len(profiles)} scheduling profiles: kvgate translates one, or llm-d's P/D "
                              "pair (prefill and decode, with a P/D profile handler)")
    for kind, _ in plugins.values():  # (declared plugins act without a pluginRef: producers, admitters)
        if kind in DONE_ELSEWHERE:
            notes.append(f"{kind}: left out ({DONE_ELSEWHERE[kind]})")
        elif kind in _ROLE_FILTERS and disaggregated:
            notes.append(f"{kind}: left out (kvgate's P/D scheduler picks each half among its role)")
        elif not (kind in SCORERS or kind in PICKERS or (disaggregated and kind in _HANDLERS | _DECIDERS)):
            raise _Untranslatable(f"plugin type {kind!r} is not one kvgate has")
        elif kind == "load-aware-scorer":
            notes.append("load-aware-scorer: kvgate's queue-scorer (shorter queues first, relative to the "
                         "pool's; its threshold left out)")
    prefix = _prefix(plugins, notes)
    if not disaggregated:
        (only,) = profiles.values()
        profile = _profile(only, plugins, prefix, role=None, block_size=block_size)
        if admission:
            profile["admission"] = dict(admission)
        return Translation(profile, tuple(notes), admission=admission, **pool_level)
    if admission:
        notes.append("saturationDetector in a P/D pair: left out (kvgate's P/D profiles admit by their own "
                     "thresholds)")
    halves = {role: _profile(profiles[role], plugins, prefix, role=role, block_size=block_size)
              for role in ("decode", "prefill")}
    pd = {"name": "epp-config-pd",
          "description": "translated from the picker's EndpointPickerConfig (--config-file), P/D",
          "disaggregation": {"decider": _decider(plugins), "decode": "decode", "prefill": "prefill"}}
    return Translation(pd, tuple(notes), halves, **pool_level)


def _profile(scheduling: Mapping[str, Any], plugins: Mapping[str, tuple[str, Mapping[str, Any]]],
             prefix: Mapping[str, int], *, role: str | None, block_size: int | None = None) -> dict[str, Any]:
    """One scheduling profile as a kvgate profile document (``role``: a P/D half's, or None; its
    feedback is :data:`FEEDBACK`, a prefill half's without sessions and stored responses, its
    ``engine-prefix-matches`` with the engines' ``block_size`` where the config names it)."""
    scorers: list[dict[str, Any]] = []
    picker = "max-score-picker"
    used: list[dict[str, Any]] = []
    for ref in scheduling.get("plugins") or ():
        found = ref.get("pluginRef") if isinstance(ref, Mapping) else None
        if not isinstance(found, str) or found not in plugins:
            raise _Untranslatable(f"pluginRef {found!r} names no plugin")
        name = found
        kind, _ = plugins[name]
        if kind in SCORERS:
            scorers.append({"plugin": name, "weight": float(ref.get("weight", 1))})
            used.append({"type": SCORERS[kind], "name": name})
        elif kind in PICKERS:
            picker = name
            used.append({"type": kind, "name": name})
    if not scorers:
        raise _Untranslatable(f"the profile {scheduling.get('name')!r} has no scorer kvgate has")
    if picker == "max-score-picker" and not any(u["name"] == picker for u in used):
        used.append({"type": "max-score-picker"})
    # a prefill half serves no stored response and pins no session (policies.disaggregation)
    filters = ["healthy-filter"] if role == "prefill" else ["stored-response-filter", "healthy-filter"]
    profile: dict[str, Any] = {
        "name": str(scheduling.get("name") or "epp-config"),
        "description": "translated from the picker's EndpointPickerConfig (--config-file)",
        "plugins": [*({"type": f} for f in filters), *used],
        "profile": {"filters": filters, "scorers": scorers, "picker": picker},
    }
    engine_prefix: dict[str, Any] = {"type": "engine-prefix-matches"}
    if block_size is not None:
        engine_prefix["parameters"] = {"block_size": block_size}
    # (a prefill half serves no stored response and pins no session, as kvgate's pd-prefill)
    feedback = (["engine-prefix-matches", "inflight-recorder", "prefix-index-recorder", "outlier-ejection"]
                if role == "prefill" else list(FEEDBACK))
    profile["plugins"] += [engine_prefix, *({"type": f} for f in feedback[1:])]
    profile["profile"]["feedback"] = feedback
    if prefix:
        profile["prefix"] = dict(prefix)
    return profile


def _decider(plugins: Mapping[str, tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """kvgate's prefix-based decider with the config's threshold: its decider's ``nonCachedTokens``
    (``always-disagg-pd-decider``: 0), else the handler's ``threshold``, else kvgate's default."""
    for kind, parameters in plugins.values():
        if kind == "always-disagg-pd-decider":
            return {"type": "prefix-based-pd-decider", "parameters": {"non_cached_tokens": 0}}
        if kind == "prefix-based-pd-decider" and isinstance(parameters.get("nonCachedTokens"), int):
            return {"type": "prefix-based-pd-decider",
                    "parameters": {"non_cached_tokens": parameters["nonCachedTokens"]}}
    for kind, parameters in plugins.values():
        if kind in _HANDLERS and isinstance(parameters.get("threshold"), int):
            threshold = parameters["threshold"]
            return {"type": "prefix-based-pd-decider", "parameters": {"non_cached_tokens": threshold}}
    return {"type": "prefix-based-pd-decider"}


def _section(parameters: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A precise plugin's settings ``name``, at the top of its parameters or (older releases) under
    ``indexerConfig``."""
    for found in (parameters.get(name), (parameters.get("indexerConfig") or {}).get(name)):
        if isinstance(found, Mapping):
            return found
    return {}


def _precise(plugins: Mapping[str, tuple[str, Mapping[str, Any]]], notes: list[str],
             ) -> tuple[int | None, KvEventsSource | None]:
    """The engines' block size and the KV-event source of the config's precise prefix plugin
    (llm-d's ``kvEventsConfig``: ``discoverPods``, the default, subscribes to each Pod's publisher at
    ``podDiscoveryConfig.socketPort``; else ``zmqEndpoint`` is bound and the engines connect)."""
    for kind, parameters in plugins.values():
        if kind not in _PRECISE_PLUGINS or not isinstance(parameters, Mapping):
            continue
        processor = _section(parameters, "tokenProcessorConfig")
        size = processor.get("blockSizeTokens", processor.get("blockSize"))
        block_size = size if isinstance(size, int) and size > 0 else None
        if "hashSeed" in processor:
            notes.append(f"{kind}: hashSeed left out (kvgate keys the engines' blocks by their tokens: "
                         "the engines' hash seed does not matter)")
        index = _section(parameters, "kvBlockIndexConfig")
        if any(key in index for key in ("redisConfig", "valkeyConfig")):
            notes.append(f"{kind}: the index's Redis/Valkey left out (kvgate's pickers share their index "
                         "through their own Redis: --redis)")
        events = parameters.get("kvEventsConfig")
        events = events if isinstance(events, Mapping) else {}
        endpoint = events.get("zmqEndpoint") if isinstance(events.get("zmqEndpoint"), str) else None
        discover = events.get("discoverPods")
        if discover is False or (discover is None and endpoint):
            if not endpoint:
                notes.append(f"{kind}: no kvEventsConfig source (discoverPods false, no zmqEndpoint)")
                return block_size, None
            return block_size, KvEventsSource(bind=endpoint)
        discovery = events.get("podDiscoveryConfig")
        discovery = discovery if isinstance(discovery, Mapping) else {}
        port = discovery.get("socketPort")
        if discovery.get("podLabelSelector"):
            notes.append(f"{kind}: podLabelSelector left out (kvgate subscribes to the pool's own endpoints)")
        if endpoint:
            notes.append(f"{kind}: zmqEndpoint left out beside discoverPods (kvgate follows one source "
                         "a pool)")
        return block_size, KvEventsSource(port=port if isinstance(port, int) and 0 < port < 65536
                                          else DEFAULT_KV_EVENTS_PORT)
    return None, None


def _admission(document: Mapping[str, Any], plugins: Mapping[str, tuple[str, Mapping[str, Any]]],
               notes: list[str]) -> dict[str, float]:
    """kvgate's admission thresholds (``admission``: a sheddable request is shed when every endpoint
    is past them, the Inference Extension's saturation rule) from the config's ``saturationDetector``
    section or its ``utilization-detector`` plugin: ``queueDepthThreshold``, ``kvCacheUtilThreshold``,
    ``metricsStalenessThreshold`` (a Go duration). Values out of range are said and left out."""
    found = [parameters for kind, parameters in plugins.values()
             if kind == "utilization-detector" and isinstance(parameters, Mapping)]
    section = _mapping(document.get("saturationDetector"))
    settings = {**section, **(found[0] if found else {})}
    out: dict[str, float] = {}
    queue = settings.get("queueDepthThreshold")
    if queue is not None:
        if isinstance(queue, int) and not isinstance(queue, bool) and queue >= 1:
            out["queue_threshold"] = queue
        else:
            notes.append(f"queueDepthThreshold {queue!r}: not a queue length of 1 or more; left out")
    kv = settings.get("kvCacheUtilThreshold")
    if kv is not None:
        if isinstance(kv, int | float) and not isinstance(kv, bool) and 0 < kv <= 1:
            out["kv_threshold"] = float(kv)
        else:
            notes.append(f"kvCacheUtilThreshold {kv!r}: not a fraction in (0, 1]; left out")
    stale = settings.get("metricsStalenessThreshold")
    if stale is not None:
        try:
            seconds = go_duration(str(stale))
        except ValueError:
            seconds = 0.0
        if seconds > 0:
            out["metrics_staleness_s"] = seconds
        else:
            notes.append(f"metricsStalenessThreshold {stale!r}: not a duration (200ms); left out")
    return out


FLOW_CONTROL_GATE = "flowControl"
DEFAULT_REQUEST_TTL_S = 60.0
"""llm-d's ``flowControl.defaultRequestTTL`` default."""
MAX_QUEUE_TIMEOUT_S = 1800.0
"""kvgate's longest queue timeout (``kvgate.io/queue-timeout``)."""
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_QUANTITY_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                   "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: object) -> int | None:
    """A Kubernetes resource quantity as a whole number (``100``, ``1k``, ``2Ki``), or None."""
    match = _QUANTITY.match(str(value).strip()) if isinstance(value, int | float | str) else None
    if match is None:
        return None
    return int(float(match.group(1)) * _QUANTITY_UNITS[match.group(2)])


def gate_on(document: Mapping[str, Any], gate: str) -> bool:
    """Whether the config's ``featureGates`` turn ``gate`` on (``name``, ``name=true``)."""
    gates = document.get("featureGates")
    for entry in gates if isinstance(gates, list) else ():
        name, _, value = str(entry).partition("=")
        if name.strip() == gate:
            return value.strip().lower() in ("", "true")
    return False


def _flow_control(document: Mapping[str, Any], admission: Mapping[str, float],
                  notes: list[str]) -> dict[str, Any] | None:
    """llm-d's flow control (the ``flowControl`` feature gate, its ``flowControl`` section) as a pool's
    ``flowControl`` (docs/flow-control.md): ``defaultRequestTTL`` the queue timeout, ``maxRequests``
    the queue's length, the bands' ordering policy (``slo-deadline-ordering-policy``) the order, the
    saturation detector's thresholds when a request waits; what kvgate does not have is said."""
    section = _mapping(document.get("flowControl"))
    if not gate_on(document, FLOW_CONTROL_GATE):
        if section:
            notes.append("flowControl: left out (its feature gate, flowControl, is off)")
        return None
    out: dict[str, Any] = {}
    ttl = section.get("defaultRequestTTL")
    timeout = DEFAULT_REQUEST_TTL_S
    if ttl is not None:
        try:
            timeout = go_duration(str(ttl))
        except ValueError:
            notes.append(f"flowControl.defaultRequestTTL {ttl!r}: not a duration; "
                         f"{DEFAULT_REQUEST_TTL_S:g} s")
        if timeout <= 0 or timeout > MAX_QUEUE_TIMEOUT_S:
            notes.append(f"flowControl.defaultRequestTTL {ttl}: kvgate waits at most "
                         f"{MAX_QUEUE_TIMEOUT_S:g} s")
            timeout = MAX_QUEUE_TIMEOUT_S
    out["queueTimeoutSeconds"] = timeout
    limit = quantity(section.get("maxRequests")) if section.get("maxRequests") is not None else None
    if limit:
        out["maxQueueLength"] = min(limit, 1_000_000)
    bands = [_mapping(band) for band in (*(section.get("priorityBands") or ()),
                                          section.get("defaultPriorityBand"),
                                          section.get("defaultNegativePriorityBand")) if band]
    orders = {str(band.get("orderingPolicyRef") or "fcfs-ordering-policy") for band in bands} or {
        "fcfs-ordering-policy"}
    if orders == {"slo-deadline-ordering-policy"}:
        out["order"] = "slo-deadline"
    elif orders != {"fcfs-ordering-policy"}:
        notes.append(f"flowControl ordering policies {sorted(orders)}: kvgate orders a pool's held requests "
                     "one way (first come, first served)")
    for key, kvgate_key in (("queue_threshold", "queueThreshold"), ("kv_threshold", "kvCacheThreshold"),
                            ("metrics_staleness_s", "metricsStalenessSeconds")):
        if key in admission:
            out[kvgate_key] = admission[key]
    left = [key for key in ("maxBytes", "noEndpointRequestTTL", "usageLimitPolicyPluginRef",
                            "enableEviction") if section.get(key)]
    left += [f"priorityBands[{band.get('priority')}].maxRequests" for band in bands
             if band.get("maxRequests")]
    if left:
        notes.append(f"flowControl {', '.join(left)}: left out (kvgate holds by the pool's queue length and "
                     "timeout, fair between tenants by GPU work: docs/flow-control.md)")
    return out


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _tokenizer(plugins: Mapping[str, tuple[str, Mapping[str, Any]]]) -> TokenizerHint | None:
    """The tokenizer the precise plugin (``tokenizersPoolConfig``) or a tokenizer plugin names."""
    for kind, parameters in plugins.values():
        if not isinstance(parameters, Mapping):
            continue
        if kind in _PRECISE_PLUGINS:
            pool = _section(parameters, "tokenizersPoolConfig")
            local = _mapping(pool.get("local"))
            files = _mapping(local.get("modelTokenizerMap"))
            model = pool.get("modelName")
            return TokenizerHint(
                model=model if isinstance(model, str) and model else None,
                files={str(k): str(v) for k, v in files.items()},
                directory=str(local["autoDiscoveryDir"]) if local.get("autoDiscoveryDir") else None,
                file_name=str(local.get("autoDiscoveryTokenizerFileName") or "tokenizer.json"),
            )
        if kind in _TOKENIZER_PLUGINS and isinstance(parameters.get("modelName"), str):
            return TokenizerHint(model=parameters["modelName"])
    return None


def _prefix(plugins: Mapping[str, tuple[str, Mapping[str, Any]]], notes: list[str]) -> dict[str, int]:
    """The prefix index's settings from the prefix plugins' parameters (module docstring)."""
    out: dict[str, int] = {}
    for kind, parameters in plugins.values():
        if kind not in _PREFIX_PLUGINS or not isinstance(parameters, Mapping):
            continue
        tokens = parameters.get("blockSizeTokens")
        if isinstance(tokens, int) and tokens > 0:
            out["block_chars"] = tokens * CHARS_PER_TOKEN
        elif isinstance(parameters.get("blockSize"), int) and parameters["blockSize"] > 0:
            out["block_chars"] = parameters["blockSize"]
        blocks = parameters.get("maxPrefixBlocksToMatch")
        max_tokens = parameters.get("maxPrefixTokensToMatch")
        if isinstance(max_tokens, int) and max_tokens > 0:
            out["max_blocks"] = max(1, max_tokens * CHARS_PER_TOKEN // out.get("block_chars", 64))
        elif isinstance(blocks, int) and blocks > 0:
            out["max_blocks"] = blocks
        capacity = parameters.get("lruCapacityPerServer")
        if isinstance(capacity, int) and capacity > 0:
            out["default_capacity_blocks"] = capacity
        if parameters.get("autoTune"):
            notes.append(f"{kind}: autoTune left out (kvgate learns each endpoint's capacity from its "
                         "KV-cache metrics)")
    return out


REFERENCE_SCORERS = frozenset({("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0),
                               ("prefix-cache-scorer", 3.0)})
"""The Inference Extension's default scheduling profile (its charts' default-plugins.yaml)."""


def is_reference_default(profile: Mapping[str, Any]) -> bool:
    """Whether a translated profile is the Inference Extension's default (module docstring), its
    admission thresholds apart (the caller gives kvgate's default profile those)."""
    if "disaggregation" in profile:
        return False
    kinds = {plugin.get("name", plugin["type"]): plugin["type"] for plugin in profile["plugins"]}
    scorers = {(kinds[ref["plugin"]], float(ref["weight"])) for ref in profile["profile"]["scorers"]}
    picker = kinds.get(profile["profile"]["picker"], profile["profile"]["picker"])
    return scorers == REFERENCE_SCORERS and picker == "max-score-picker" and not profile.get("prefix")
