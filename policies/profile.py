"""Scheduling profiles: declared in YAML, built into plugin instances by a :class:`PluginRegistry`.

::

    name: default
    plugins:                                   # instances: type, optional name (default: type), parameters
      - {type: saturation-filter, parameters: {queue_threshold: 5}}
      - {type: estimated-ttft-scorer, name: ttft}
      - {type: max-score-picker, parameters: {tie_tolerance: 0.02}}
      - {type: inflight-recorder}              # feedback: what the scheduler records of its picks
      - {type: prefix-index-recorder}
    profile:                                   # which instances run, in order, with scorer weights
      filters: [saturation-filter]
      scorers: [{plugin: ttft, weight: 1.0}]
      picker: max-score-picker
      feedback: [inflight-recorder, prefix-index-recorder]   # absent: DEFAULT_FEEDBACK
    fallbacks: 2                               # endpoints ranked after the pick
    session_header: x-session-id               # session affinity key (when the request has none)
    prefix: {block_chars: 64, max_blocks: 256, hash: chained-xor, default_capacity_blocks: 31250}
    admission: {queue_threshold: 5, kv_threshold: 0.8, metrics_staleness_s: 0.2, retry_after_s: 1.0}

Shipped profiles live in ``policies/profiles/`` and load by name; any other file loads by path.

What the plugins consume must be produced by a plugin of the profile (``policies.feedback``): a
scorer reading the prefix index needs ``prefix-index-recorder`` among the feedback plugins. A
profile without ``feedback`` gets :data:`DEFAULT_FEEDBACK`, and ``prefix-index-recorder`` when one of
its plugins reads the prefix index (profiles written before feedback plugins existed run as they
did).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import yaml
from pydantic import Field, ValidationError

from kvgate.policies.errors import ConfigError
from kvgate.policies.feedback import FeedbackBlueprint
from kvgate.policies.framework import PREFIX_INDEX, Filter, Picker, Scorer, declared
from kvgate.policies.hashing import HashScheme
from kvgate.policies.plugins.params import Params
from kvgate.policies.plugins.recorders import default_blueprints
from kvgate.policies.registry import PluginRegistry, builtin_registry
from kvgate.policies.saturation import SaturationThresholds
from kvgate.policies.validation import describe

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Named(Generic[T]):
    """A plugin instance with the type and name it was declared with (used in timing metrics)."""

    plugin_type: str
    name: str
    plugin: T


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    plugin_type: str
    name: str
    plugin: Scorer
    weight: float


@dataclass(frozen=True, slots=True)
class PrefixSettings:
    block_chars: int = 64
    max_blocks: int = 256
    hash_scheme: HashScheme = "chained-xor"
    default_capacity_blocks: int = 31_250
    """Index capacity per endpoint when it reports no ``num_gpu_blocks`` (GIE's default)."""


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    thresholds: SaturationThresholds = field(default_factory=SaturationThresholds)
    retry_after_s: float = 1.0


@dataclass(frozen=True, slots=True)
class SchedulingProfile:
    name: str
    filters: tuple[Named[Filter], ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Named[Picker]
    fallbacks: int = 2
    session_header: str = "x-session-id"
    prefix: PrefixSettings = field(default_factory=PrefixSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    feedback: tuple[Named[FeedbackBlueprint], ...] = ()
    """The feedback plugins each scheduler of this profile creates (``policies.feedback``)."""


DEFAULT_FEEDBACK = ("inflight-recorder", "session-recorder", "stored-response-recorder", "outlier-ejection")
"""The feedback of a profile that lists none (``prefix-index-recorder`` added when a plugin reads
the prefix index)."""


# --- the YAML schema -------------------------------------------------------------------------


class _PluginSpec(Params):
    type: str
    name: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class _ScorerRef(Params):
    plugin: str
    weight: Annotated[float, Field(ge=0.0)] = 1.0


class _ProfileSpec(Params):
    filters: list[str] = Field(default_factory=list)
    scorers: list[_ScorerRef] = Field(default_factory=list)
    picker: str
    feedback: list[str] | None = None


class _PrefixSpec(Params):
    block_chars: Annotated[int, Field(ge=1)] = 64
    max_blocks: Annotated[int, Field(ge=1)] = 256
    hash: HashScheme = "chained-xor"
    default_capacity_blocks: Annotated[int, Field(ge=1)] = 31_250


class _AdmissionSpec(Params):
    queue_threshold: Annotated[int, Field(ge=1)] = 5
    kv_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = 0.8
    metrics_staleness_s: Annotated[float, Field(gt=0.0)] = 0.2
    retry_after_s: Annotated[float, Field(gt=0.0)] = 1.0


class _ProfileFile(Params):
    name: str
    description: str = ""
    plugins: list[_PluginSpec]
    profile: _ProfileSpec
    fallbacks: Annotated[int, Field(ge=0)] = 2
    session_header: str = "x-session-id"
    prefix: _PrefixSpec = _PrefixSpec()
    admission: _AdmissionSpec = _AdmissionSpec()


# --- building --------------------------------------------------------------------------------


def build_profile(data: Mapping[str, Any], registry: PluginRegistry | None = None) -> SchedulingProfile:
    """Validate a parsed profile document and build its plugins with ``registry`` (default: built-ins)."""
    registry = registry or builtin_registry()
    if "disaggregation" in data:
        raise ConfigError(f"profile {data.get('name')!r} is a disaggregated profile "
                          "(load it with policies.disaggregation.load_scheduling)")
    try:
        spec = _ProfileFile.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(f"invalid scheduling profile: {describe(exc)}") from exc
    instances: dict[str, tuple[str, object]] = {}
    for plugin in spec.plugins:
        name = plugin.name or plugin.type
        if name in instances:
            raise ConfigError(f"profile {spec.name!r}: duplicate plugin name {name!r}")
        instances[name] = (plugin.type, registry.create(plugin.type, plugin.parameters))

    def lookup(name: str, kind: type[T], role: str) -> Named[T]:
        if name not in instances:
            raise ConfigError(f"profile {spec.name!r}: {role} {name!r} is not declared under plugins")
        plugin_type, plugin = instances[name]
        if not isinstance(plugin, kind):
            raise ConfigError(f"profile {spec.name!r}: plugin {name!r} ({plugin_type}) is not a {role}")
        return Named(plugin_type, name, plugin)

    filters = tuple(lookup(n, Filter, "filter") for n in spec.profile.filters)  # type: ignore[type-abstract]
    scorers = []
    for ref in spec.profile.scorers:
        named = lookup(ref.plugin, Scorer, "scorer")  # type: ignore[type-abstract]
        scorers.append(WeightedScorer(named.plugin_type, named.name, named.plugin, ref.weight))
    picker = lookup(spec.profile.picker, Picker, "picker")  # type: ignore[type-abstract]
    chosen: list[object] = [*(f.plugin for f in filters), *(s.plugin for s in scorers), picker.plugin]
    feedback_names = spec.profile.feedback
    if feedback_names is None:  # a profile that lists none: the defaults, built here
        reads_prefix = any(PREFIX_INDEX in declared(p)[1] for p in chosen)
        feedback_names = [*DEFAULT_FEEDBACK, *(["prefix-index-recorder"] if reads_prefix else [])]
        built_in = default_blueprints()
        for name in feedback_names:
            instances.setdefault(name, (name, built_in[name]))
    feedback = tuple(
        lookup(n, FeedbackBlueprint, "feedback plugin") for n in feedback_names  # type: ignore[type-abstract]
    )
    declaring: list[tuple[str, object]] = [(f.name, f.plugin) for f in filters]
    declaring += [(w.name, w.plugin) for w in scorers]
    declaring += [(picker.name, picker.plugin), *((f.name, f.plugin) for f in feedback)]
    _check_declarations(spec.name, declaring)
    a = spec.admission
    return SchedulingProfile(
        name=spec.name,
        filters=filters,
        scorers=tuple(scorers),
        picker=picker,
        fallbacks=spec.fallbacks,
        session_header=spec.session_header.lower(),
        prefix=PrefixSettings(
            spec.prefix.block_chars,
            spec.prefix.max_blocks,
            spec.prefix.hash,
            spec.prefix.default_capacity_blocks,
        ),
        admission=AdmissionSettings(
            SaturationThresholds(a.queue_threshold, a.kv_threshold, a.metrics_staleness_s), a.retry_after_s
        ),
        feedback=feedback,
    )


def _check_declarations(profile: str, plugins: list[tuple[str, object]]) -> None:
    """Everything a plugin consumes is produced by a plugin of the profile."""
    produced = {item for _, plugin in plugins for item in declared(plugin)[0]}
    for name, plugin in plugins:
        missing = sorted(declared(plugin)[1] - produced)
        if missing:
            raise ConfigError(
                f"profile {profile!r}: plugin {name!r} consumes {', '.join(missing)}, which no plugin of "
                "the profile produces (add its recorder to profile.feedback, e.g. prefix-index-recorder)"
            )


def available_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped under ``policies/profiles/``."""
    folder = resources.files("kvgate.policies").joinpath("profiles")
    return tuple(sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml")))


def load_profile(name_or_path: str | Path, registry: PluginRegistry | None = None) -> SchedulingProfile:
    """Load a shipped profile by name (``"default"``) or any profile file by path."""
    return build_profile(read_profile_document(name_or_path), registry)


def read_profile_document(name_or_path: str | Path) -> Mapping[str, Any]:
    """The parsed YAML of a shipped profile (by name) or of a profile file (by path)."""
    text = _read(name_or_path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"scheduling profile {str(name_or_path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"scheduling profile {str(name_or_path)!r} must be a mapping")
    return data


def _read(name_or_path: str | Path) -> str:
    as_text = str(name_or_path)
    if isinstance(name_or_path, Path) or as_text.endswith((".yaml", ".yml")) or "/" in as_text:
        try:
            return Path(as_text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read scheduling profile {as_text!r}: {exc}") from exc
    if as_text not in available_profiles():
        shipped = ", ".join(available_profiles())
        raise ConfigError(f"unknown scheduling profile {as_text!r} (shipped: {shipped})")
    profiles = resources.files("kvgate.policies").joinpath("profiles")
    return profiles.joinpath(f"{as_text}.yaml").read_text(encoding="utf-8")
