"""One request's plan: how its ext_proc conversation will go, decided once when its headers arrive.

The lifecycle's transition table says what each message does in each state; the plan says, for this
request, which of the table's paths it takes: whether its body comes in one message (BUFFERED) or in
full-duplex chunks, whether its headers are answered before they are read, whether its response body
is read, whether its response phases are skipped, and whether Envoy reports its outcome afterwards.
Nothing in it changes after the headers: a frozen value, chosen by :func:`plan_request`.

The choices (kvgate's one-pass data path, ``LifecycleConfig``):

- **read the response body** (``observe``) when Envoy sends it anyway (full duplex), when the pool
  counts tokens (a tenant limit), when the request states latency objectives (``x-slo-ttft-ms``,
  ``x-slo-tpot-ms``: its first token and usage tell whether they were met), or when this request is
  sampled for usage (``observe_usage``);
- **skip the response phases** (``skip_response``) when nothing reads the response: the one-pass
  mode (a BUFFERED request, the response body off), ``skip_unread_responses`` on, a pool without
  model rewrites and no ``x-gateway-model-name-rewrite`` (a response's ``model`` would need
  renaming), no session persistence (a new session
  is told in the response's headers) and the body not observed; a request
  without a body is never skipped (its reply to the headers is its decision);
- **reported** when skipped and Envoy reports outcomes to the picker (``extproc.outcomes``);
- **read the headers later** when a BUFFERED body follows: the reply to the headers depends on none
  of them, so it goes first (``extproc.lifecycle``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.extproc import names
from kvgate.extproc.events import BodyMode, BodyModes, Headers
from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.extproc.ports import Pool
from kvgate.policies.latency_objectives import TPOT_SLO_HEADER, TTFT_SLO_HEADER


@dataclass(frozen=True, slots=True)
class RequestPlan:
    modes: BodyModes
    observe: bool
    """The response body is read (turned on for this request when Envoy does not send it)."""
    skip_response: bool
    """No response message comes to the picker: the stream's end is the request's end."""
    reported: bool
    """Envoy reports the request's status and serving endpoint afterwards."""
    read_headers_later: bool
    """The reply to the headers goes before they are read (a BUFFERED body follows)."""

    @property
    def full_duplex_request(self) -> bool:
        return self.modes.request is BodyMode.FULL_DUPLEX_STREAMED

    @property
    def buffered_request(self) -> bool:
        return self.modes.request is BodyMode.BUFFERED

    @property
    def response_body_off(self) -> bool:
        """Envoy sends no response body unless this request turns it on (the one-pass data path)."""
        return self.modes.response is BodyMode.NONE


_READ_RESPONSE_HEADERS = frozenset({TTFT_SLO_HEADER, TPOT_SLO_HEADER, names.MODEL_REWRITE_HEADER})


def plan_request(modes: BodyModes, *, has_body: bool, pool: Pool, config: LifecycleConfig,
                 headers: Headers = ()) -> RequestPlan:
    """The plan of a request with these body ``modes`` and ``headers`` for ``pool`` (asks the usage
    sampler once)."""
    objectives = renamed = False
    for name, _ in headers:  # (Envoy names headers in lower case)
        if name in _READ_RESPONSE_HEADERS:
            if name == names.MODEL_REWRITE_HEADER:
                renamed = True
            else:
                objectives = True
    response_body_off = modes.response is BodyMode.NONE
    limiter = config.tenant_limiter
    observe = (
        not response_body_off
        or objectives
        or (limiter is not None and limiter.counts_tokens(pool.name))
        or (config.observe_usage is not None and config.observe_usage())
    )
    buffered = modes.request is BodyMode.BUFFERED
    skip = (
        has_body and not observe and config.skip_unread_responses and buffered and response_body_off
        and not pool.rewrites_models and not renamed  # (the response's model is renamed back)
        and config.session is None  # (a new session is told in the response)
    )
    return RequestPlan(
        modes, observe, skip, skip and config.outcome_reports, read_headers_later=has_body and buffered,
    )
