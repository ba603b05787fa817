"""Turn a complete request (headers + body) into an InferenceRequest and a scheduling decision."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

from kvgate.extproc import names
from kvgate.extproc.anthropic_messages import Chat, anthropic_chat
from kvgate.extproc.form_request import Form, form_boundary, parse_form_request, with_model
from kvgate.extproc.inference_paths import route_of, stored_response_of
from kvgate.extproc.model_names import check_model_name
from kvgate.extproc.openai_request import OpenAIRequest, parse_request_body, upstream_body
from kvgate.extproc.ports import OTHER_MODELS, Pool, RequestLabels, RequestMetrics, TenantKey, TenantLimiter
from kvgate.extproc.responses_messages import StoredResponse, responses_messages, stored_response
from kvgate.extproc.session_spread import RecentSessions
from kvgate.extproc.upgrades import REALTIME_PATH, realtime_model
from kvgate.policies.contracts import Keep, SchedulingResult
from kvgate.policies.errors import (
    BadRequestError,
    MalformedBodyError,
    ModelNotFoundError,
    NoEligibleEndpointError,
)
from kvgate.policies.framework import SchedulingTrace
from kvgate.policies.types import PROMPT_OPTIONS, ApiKind, EndpointView, InferenceRequest


@dataclass(frozen=True, slots=True)
class Decision:
    """The routed request: what the scheduler saw, what it chose, and the body to send upstream."""

    request: InferenceRequest
    result: SchedulingResult
    body: bytes
    body_rewritten: bool
    usage_injected: bool
    labels: RequestLabels
    """The request's metric labels: its pool, and its model names where the pool knows them."""
    tenant: TenantKey | None = None
    """The tenant the request was counted against (its tokens are charged when usage arrives)."""
    prefill_by_picker: bool = False
    """The request was given a prefill endpoint and the picker runs the prefill
    (``extproc.prefill_step``); with a prefill endpoint and this False, the data plane's sidecar
    runs it, told ``x-prefiller-host-port``."""

    @property
    def sidecar_prefill(self) -> str | None:
        """The prefill endpoint the data plane's decode-side sidecar is to use, if it is to."""
        prefill = self.result.prefill
        return prefill.endpoint.address if prefill is not None and not self.prefill_by_picker else None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A parsed request before its pick (it may wait in its pool's holding area in between)."""

    request: InferenceRequest
    body: bytes
    """What goes upstream (the model renamed, usage asked for, where that applies)."""
    body_rewritten: bool
    usage_injected: bool
    known: bool | None
    """The client's model is one the pool knows (a metrics label may name it)."""
    tenant: TenantKey | None
    target_known: bool | None = None
    """The same of the model the replica serves."""


def decide(
    *,
    pool: Pool,
    api: ApiKind,
    headers: MappingProxyType[str, str],
    body: bytes,
    subset: Sequence[str] | None,
    now: Callable[[], float],
    inject_usage: bool,
    request_id: str,
    metrics: RequestMetrics,
    limiter: TenantLimiter | None = None,
    trace: SchedulingTrace | None = None,
) -> Decision:
    """:func:`prepare` then :func:`schedule` (no wait between)."""
    prepared = prepare(pool=pool, api=api, headers=headers, body=body, subset=subset,
                       inject_usage=inject_usage, request_id=request_id, limiter=limiter)
    return schedule(prepared, pool=pool, now=now, metrics=metrics, limiter=limiter, trace=trace)


_NOT_STORED = StoredResponse(None, None, added=False)


def prepare(
    *,
    pool: Pool,
    api: ApiKind,
    headers: MappingProxyType[str, str],
    body: bytes,
    subset: Sequence[str] | None,
    inject_usage: bool,
    request_id: str,
    limiter: TenantLimiter | None = None,
    session_id: str | None = None,
) -> Prepared:
    """Parse, check the model and the tenant's limits. ``headers`` (lower-case names, read-only)
    become the request's own, not copied.

    Raises the KvgateError the client should see: 400 for a bad body, 404 for a model the pool
    does not serve, 429 when the tenant is over its rate limit (checked here, counted once routed).
    """
    model = ""
    prompt = ""
    stream = False
    cache_salt: str | None = None
    max_tokens: int | None = None
    target_model = ""
    upstream = body
    rewritten = injected = False
    parsed = None
    stored = _NOT_STORED
    boundary = form_boundary(headers.get("content-type")) if body and api is ApiKind.OTHER else None
    form: Form | None = None
    if boundary is not None:  # the audio APIs' forms
        found = parse_form_request(api, boundary, body)
        if found is not None:
            parsed, form = found
    elif body and api is not ApiKind.OTHER:
        parsed = parse_request_body(api, body, name_media=pool.names_inline_media)
    elif body:
        try:
            parsed = parse_request_body(api, body)
        except BadRequestError:
            parsed = None  # an API kvgate does not know, with an opaque body: route it without a model
    elif api is not ApiKind.OTHER and headers.get(":method") != "OPTIONS":
        raise MalformedBodyError("request body is empty")
    elif "upgrade" in headers:  # a realtime session (``extproc.upgrades``): a model named in its query
        model = target_model = realtime_model(headers.get(":path", ""))
        if model and pool.model_known(model) is False:
            raise ModelNotFoundError.of(model)
    elif route_of(headers.get(":path", "")).endswith(REALTIME_PATH) and headers.get(":method") == "GET":
        raise BadRequestError(f"{REALTIME_PATH} opens a WebSocket session: send Upgrade: websocket")
    # (a CORS preflight carries no body: it is routed like a bodyless API call, for the server to answer)
    known: bool | None = None
    target_known: bool | None = None
    if parsed is not None:
        model, prompt, stream = parsed.model, parsed.prompt, parsed.stream
        cache_salt, max_tokens = parsed.cache_salt, parsed.max_tokens
        known = pool.model_known(model)
        target_model, target_known = _target_model(pool, model, known, headers)
        if parsed.api is ApiKind.RESPONSES:
            stored = stored_response(parsed.document)
        added = {"request_id": stored.response_id} if stored.added and stored.response_id else None
        if form is not None:
            if target_model != model:
                upstream, rewritten = with_model(body, form, target_model), True
        else:
            prepared = upstream_body(parsed, body, target_model, inject_usage=inject_usage, added=added)
            upstream, rewritten, injected = prepared.data, prepared.rewritten, prepared.usage_injected

    if api is ApiKind.OTHER and stored.previous_response_id is None:  # a stored response's own path
        named = stored_response_of(route_of(headers.get(":path", "")))
        if named is not None:
            stored = StoredResponse(None, named, added=False)
    # a Messages API request's chat, built once for its messages and its tools (tens of µs a turn)
    chat = anthropic_chat(parsed.document) if parsed is not None and parsed.api is ApiKind.MESSAGES else None
    objective = headers.get(names.OBJECTIVE_HEADER)
    priority = (pool.objective_priority(objective) if objective else None) or 0
    request = InferenceRequest(
        request_id=request_id,
        pool=pool.name,
        model=model,
        target_model=target_model,
        api=api,
        prompt=prompt,
        stream=stream,
        priority=priority,
        fairness_id=headers.get(names.FAIRNESS_HEADER),
        session_id=session_id or headers.get(names.SESSION_HEADER),
        cache_salt=cache_salt,
        max_tokens=max_tokens,
        body_size=len(body),
        subset=frozenset(subset) if subset is not None else None,
        headers=headers,
        messages=_messages(parsed, chat),
        engine_prompt=parsed.engine_prompt if parsed is not None else None,
        prompt_options=_prompt_options(parsed, chat),
        response_id=stored.response_id,
        previous_response_id=stored.previous_response_id,
    )
    tenant = limiter.check(pool.name, headers) if limiter is not None else None
    return Prepared(request, upstream, rewritten, injected, known, tenant, target_known)


def _target_model(pool: Pool, model: str, known: bool | None,
                  headers: Mapping[str, str]) -> tuple[str, bool | None]:
    """The model the replica serves, and whether the pool knows it: an InferenceModelRewrite rule's
    for ``model``, else the request's ``x-gateway-model-name-rewrite``, else ``model`` itself (as
    llm-d's picker orders them). The model served is checked: 404 for ``model`` when it is served
    and the pool does not know it; an override is checked as a body's model is (400 for a name the
    gateway refuses, 404 for one the pool does not serve), the client's own name then an alias; a
    pool that does not take the header (``Pool.honors_model_rewrite_header``) answers it 400."""
    override = headers.get(names.MODEL_REWRITE_HEADER)
    if override is not None and not pool.honors_model_rewrite_header:
        raise BadRequestError(f"the {names.MODEL_REWRITE_HEADER} header is not accepted for this model pool")
    target = pool.rewrite_model(model, headers)
    if override is None or target != model:
        if known is False:
            raise ModelNotFoundError.of(model)
        return target, known
    check_model_name(override)
    target_known = pool.model_known(override)
    if target_known is False:
        raise ModelNotFoundError.of(override)
    return override, target_known


def schedule(
    prepared: Prepared,
    *,
    pool: Pool,
    now: Callable[[], float],
    metrics: RequestMetrics,
    limiter: TenantLimiter | None = None,
    trace: SchedulingTrace | None = None,
    reserved: bool = False,
    sessions: RecentSessions | None = None,
) -> Decision:
    """Schedule a prepared request over the pool's live endpoints (with flow control, those with
    room; the caller tells the scheduler ``on_picked``). Raises 503 when nothing is eligible (also
    when the subset hint matches nothing) or whatever the scheduler raises (429 shed)."""
    request = prepared.request
    candidates = pool.endpoints()  # (the scheduler keeps what a subset hint allows per snapshot)
    if not candidates:
        raise NoEligibleEndpointError(f"pool {pool.name!r} has no endpoints")
    holding = pool.holding
    # flow control: the pick among endpoints with room (all, if none has), asked of the endpoints
    # the profile's filters chose (a pass over a large pool per pick cost O(pool))
    # (not for a request continuing a stored response: moved for room it lands where vLLM answers 404)
    keep: Keep | None = None if holding is None or request.previous_response_id is not None else partial(
        holding.with_room, reserved=reserved)
    started = now()
    if sessions is not None and "upgrade" in request.headers:  # a realtime session: spread them
        keep = _spreading(sessions, pool.name, started, keep)
    result = pool.scheduler.schedule(request, candidates, started, trace, keep=keep)
    if sessions is not None and "upgrade" in request.headers:
        sessions.picked(pool.name, result.pick.address, started)
    metrics.scheduled(pool.name, now() - started)
    if not result.ranked:
        raise NoEligibleEndpointError("the scheduler ranked no endpoint")
    subset = request.subset
    if subset is not None and not all(e.address in subset or e.host in subset for e in result.ranked):
        raise NoEligibleEndpointError("the scheduler ranked an endpoint outside the subset hint")
    tenant = prepared.tenant
    if tenant is not None and limiter is not None:
        limiter.record_request(tenant)
    model, target_model = request.model, request.target_model
    labels = RequestLabels(pool.name, model if prepared.known or not model else OTHER_MODELS,
                           target_model if prepared.target_known or not target_model else OTHER_MODELS)
    metrics.request_picked(labels, request.body_size)
    return Decision(request, result, prepared.body, prepared.body_rewritten, prepared.usage_injected,
                    labels, tenant, prefill_by_picker=result.prefill is not None and pool.picker_runs_prefill)


def _spreading(sessions: RecentSessions, pool: str, now: float, keep: Keep | None) -> Keep:
    """``keep`` (flow control's, if any), then the endpoints that took the fewest sessions lately."""

    def fewest(endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        kept = keep(endpoints) if keep is not None else endpoints
        return sessions.fewest(pool, kept, now) if kept else kept

    return fewest


def _prompt_options(parsed: OpenAIRequest | None, chat: Chat | None) -> Mapping[str, Any] | None:
    """A completion's or chat's fields that shape the engine's prompt as sent
    (``types.PROMPT_OPTIONS``), or None when it sends none; a Messages API request's tools as its
    ``chat``'s (``extproc.anthropic_messages``)."""
    if parsed is not None and parsed.api is ApiKind.MESSAGES:
        tools = chat[1] if chat is not None else None
        # (an empty list too: vLLM hands the template [] then, not None, and templates tell them apart)
        return MappingProxyType({"tools": list(tools)}) if tools is not None else None
    if parsed is None or parsed.api not in (ApiKind.CHAT_COMPLETIONS, ApiKind.COMPLETIONS):
        return None
    document = parsed.document
    found = {key: document[key] for key in PROMPT_OPTIONS if key in document}
    return MappingProxyType(found) if found else None


def _messages(parsed: OpenAIRequest | None, chat: Chat | None) -> tuple[Mapping[str, Any], ...] | None:
    """A chat request's messages (``parse_request_body`` checked they are a list of objects), or a
    Responses API or Messages API request's as vLLM builds them (``extproc.responses_messages``,
    ``extproc.anthropic_messages``)."""
    if parsed is None:
        return None
    if parsed.api is ApiKind.RESPONSES:
        return responses_messages(parsed.document)
    if parsed.api is ApiKind.MESSAGES:
        return chat[0] if chat is not None else None
    if parsed.api is not ApiKind.CHAT_COMPLETIONS:
        return None
    messages = parsed.document.get("messages")
    return tuple(messages) if isinstance(messages, list) else None
