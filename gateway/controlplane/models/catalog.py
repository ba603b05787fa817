"""The models a client can name through one Gateway listener port: what ``GET /v1/models`` lists.

Pure: a :class:`~gateway.controlplane.resources.ValidatedConfig`, the listener port the request came
in on, and what each pool's ready replicas report (:class:`PoolModels`) in; OpenAI model objects out.

Where the names come from, for the routes attached to the port:

- a rule match with an exact ``X-Gateway-Model-Name`` header match **declares** that model, for the
  rule's InferencePools: it is listed even when no replica of those pools is ready (see below);
- a rule match with a regular-expression model match lists what the rule's pools' ready replicas
  report (base models and LoRA adapters, as their ``/v1/models`` says), filtered by the expression;
- a rule match without a model match lists everything its pools' ready replicas report;
- the source names of the pools' InferenceModelRewrites (exact ones) are names a client can send,
  listed where the rule lets them through.

A declared model with no ready replica in any of its pools is listed with ``"kvgate": {"ready":
false}``: a client that discovers models first (chat front ends, model pickers) still sees that the
model exists here, while a request for it answers 503 until a replica is ready. Every entry carries
``"kvgate": {"ready": bool, "pools": [...]}``; OpenAI's clients ignore fields they do not know.

Models reported by replicas keep the fields vLLM gives them (``root``, ``parent``,
``max_model_len``); a declared name no replica reports is shown as the gateway's own
(``owned_by: "kvgate"``, ``root`` = the id, ``parent`` null).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.extproc.names import MODEL_NAME_HEADER
from kvgate.gateway.controlplane.resources import ValidatedConfig
from kvgate.gateway.controlplane.resources.resolved import BackendKind, ResolvedRule
from kvgate.gateway.picker.replica_models import PoolModels

JsonDict = dict[str, Any]

_ANY = re.compile(".*", re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Source:
    pools: tuple[str, ...]
    declared: str | None  # an exact model match
    pattern: re.Pattern[str] | None  # a regular-expression match; None with declared


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: str
    pools: tuple[str, ...]
    ready: bool
    card: Mapping[str, Any]


def _model_filter(headers: Iterable[Any]) -> tuple[str | None, re.Pattern[str] | None]:
    for header in headers:
        if header.name.lower() != MODEL_NAME_HEADER:
            continue
        if header.type == "Exact":
            return header.value, None
        try:
            return None, re.compile(header.value)
        except re.error:
            return None, re.compile(r"(?!)")  # an expression Python cannot read matches nothing here
    return None, _ANY


def _rule_sources(rule: ResolvedRule) -> list[_Source]:
    pools = tuple(
        sorted({b.pool.id for b in rule.backends if b.kind is BackendKind.INFERENCE_POOL and b.valid
                and b.pool is not None})
    )
    if not pools:
        return []
    matches = rule.matches or ()
    if not matches:
        return [_Source(pools, None, _ANY)]
    return [_Source(pools, *_model_filter(match.headers)) for match in matches]


def _sources(config: ValidatedConfig, port: int) -> list[_Source]:
    found: list[_Source] = []
    for route in config.routes:
        if not any(attachment.port == port for attachment in route.attachments):
            continue
        for rule in route.rules:
            found.extend(_rule_sources(rule))
    return found


def declared_models(config: ValidatedConfig) -> dict[str, set[str]]:
    """Pool id → the models routes send it by an exact model match (on any listener)."""
    declared: dict[str, set[str]] = {}
    for route in config.routes:
        for rule in route.rules:
            for source in _rule_sources(rule):
                if source.declared is not None:
                    for pool in source.pools:
                        declared.setdefault(pool, set()).add(source.declared)
    return declared


def _rewrite_sources(config: ValidatedConfig) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for pool_key, table in config.rewrites.items():
        for rule in table.rules:
            names.setdefault(str(pool_key), set()).update(rule.models)
    return names


def catalog(
    config: ValidatedConfig, port: int, reported: Mapping[str, PoolModels]
) -> tuple[ModelEntry, ...]:
    """The models of listener ``port``, sorted by id."""
    rewrites = _rewrite_sources(config)
    pools_of: dict[str, set[str]] = {}
    cards: dict[str, Mapping[str, Any]] = {}
    declared: set[str] = set()
    for source in _sources(config, port):
        if source.declared is not None:
            declared.add(source.declared)
            pools_of.setdefault(source.declared, set()).update(source.pools)
            continue
        assert source.pattern is not None
        for pool in source.pools:
            report = reported.get(pool, PoolModels())
            offered = [(m.id, m.card) for m in report.models if report.ready_replicas > 0]
            offered += [(name, {}) for name in sorted(rewrites.get(pool, ()))]
            for model_id, card in offered:
                if source.pattern.fullmatch(model_id):
                    pools_of.setdefault(model_id, set()).add(pool)
                    if card and model_id not in cards:
                        cards[model_id] = card
    entries = []
    for model_id in sorted(pools_of):
        pools = tuple(sorted(pools_of[model_id]))
        ready = any(reported.get(pool, PoolModels()).ready_replicas > 0 for pool in pools)
        card = cards.get(model_id) or _reported_card(model_id, pools, reported)
        entries.append(ModelEntry(model_id, pools, ready, card))
    return tuple(entries)


def _reported_card(
    model_id: str, pools: tuple[str, ...], reported: Mapping[str, PoolModels]
) -> Mapping[str, Any]:
    for pool in pools:
        for model in reported.get(pool, PoolModels()).models:
            if model.id == model_id:
                return model.card
    return {}


def model_object(entry: ModelEntry, created: int) -> JsonDict:
    """``entry`` as an OpenAI model object (vLLM's fields kept where a replica gave them)."""
    card = dict(entry.card)
    card.pop("permission", None)  # per replica; says nothing about the gateway
    body: JsonDict = {
        "id": entry.id,
        "object": "model",
        "created": card.pop("created", created),
        "owned_by": card.pop("owned_by", "kvgate"),
        "root": card.pop("root", entry.id),
        "parent": card.pop("parent", None),
    }
    card.pop("id", None)
    card.pop("object", None)
    body.update(card)
    body["kvgate"] = {"ready": entry.ready, "pools": list(entry.pools)}
    return body


def model_list(entries: Iterable[ModelEntry], created: int) -> JsonDict:
    return {"object": "list", "data": [model_object(entry, created) for entry in entries]}
