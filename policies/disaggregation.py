"""Disaggregated prefill and decode: a profile of two profiles and a decider (llm-d's P/D profile
handler), in YAML::

    name: pd
    description: ...
    disaggregation:
      decider: {type: prefix-based-pd-decider, parameters: {non_cached_tokens: 256}}
      decode: pd-decode        # a profile (shipped name or path) run over the decode endpoints
      prefill: pd-prefill      # ... and over the prefill endpoints

Per request (``policies.pd_scheduler``): the decode profile picks among the endpoints that decode
(role ``decode`` or ``both``); the decider, reading the decode pick's predicted prefix hit, says
whether the uncached part of the prompt is worth a prefill hop; if so the prefill profile picks
among the endpoints that prefill (``prefill`` or ``both``), never the decode pick itself. Both
profiles share the pool's state (in-flight counts, the prefix index), so they must hash prompts the
same way (same ``prefix`` settings). The prefill profile must not pin sessions (its picks would
overwrite the decode side's pins): list its feedback without ``session-recorder``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from kvgate.policies.errors import ConfigError
from kvgate.policies.framework import SESSIONS, declared
from kvgate.policies.plugins.deciders import DisaggregationDecider, HopJudge
from kvgate.policies.plugins.params import Params
from kvgate.policies.profile import (
    Named,
    SchedulingProfile,
    build_profile,
    load_profile,
    read_profile_document,
)
from kvgate.policies.registry import PluginRegistry, builtin_registry
from kvgate.policies.validation import describe


@dataclass(frozen=True, slots=True)
class DisaggregatedProfile:
    name: str
    decode: SchedulingProfile
    prefill: SchedulingProfile
    decider: Named[DisaggregationDecider]


class _DeciderSpec(Params):
    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class _DisaggregationSpec(Params):
    decider: _DeciderSpec
    decode: str
    prefill: str


class _DisaggregatedFile(Params):
    name: str
    description: str = ""
    disaggregation: _DisaggregationSpec


def build_disaggregated(
    data: Mapping[str, Any], registry: PluginRegistry | None = None
) -> DisaggregatedProfile:
    registry = registry or builtin_registry()
    try:
        spec = _DisaggregatedFile.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(f"invalid disaggregated profile: {describe(exc)}") from exc
    d = spec.disaggregation
    decider = registry.create(d.decider.type, d.decider.parameters)
    if not isinstance(decider, DisaggregationDecider):
        raise ConfigError(f"profile {spec.name!r}: {d.decider.type!r} is not a disaggregation decider")
    decode = load_profile(d.decode, registry)
    prefill = load_profile(d.prefill, registry)
    if decode.prefix != prefill.prefix:
        raise ConfigError(f"profile {spec.name!r}: {d.decode!r} and {d.prefill!r} must share their prefix "
                          "settings (one prefix index serves both)")
    if any(SESSIONS in declared(f.plugin)[0] for f in prefill.feedback):
        raise ConfigError(f"profile {spec.name!r}: the prefill profile {d.prefill!r} must not pin sessions "
                          "(drop session-recorder from its feedback)")
    for half_name, half in ((d.decode, decode), (d.prefill, prefill)):
        if half is prefill and not isinstance(decider, HopJudge):
            continue  # only a hop judge reads the prefill half's context
        missing = sorted(declared(decider)[1] - _produced(half))
        if missing:
            raise ConfigError(f"profile {spec.name!r}: decider {d.decider.type!r} consumes "
                              f"{', '.join(missing)}, which the profile {half_name!r} does not produce")
    return DisaggregatedProfile(spec.name, decode, prefill, Named(d.decider.type, d.decider.type, decider))


def _produced(profile: SchedulingProfile) -> set[str]:
    """What a profile's scorers and feedback produce for the plugins that read the context."""
    plugins: list[object] = [w.plugin for w in profile.scorers] + [f.plugin for f in profile.feedback]
    return {item for plugin in plugins for item in declared(plugin)[0]}


def load_scheduling(
    name_or_path: str | Path, registry: PluginRegistry | None = None
) -> SchedulingProfile | DisaggregatedProfile:
    """A profile by name or path: an ordinary one, or a disaggregated one (a ``disaggregation`` key)."""
    data = read_profile_document(name_or_path)
    if "disaggregation" in data:
        return build_disaggregated(data, registry)
    return build_profile(data, registry)
