"""The plugin registry: an object mapping a plugin ``type`` name to a factory (never a global table)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from kvgate.policies.errors import ConfigError
from kvgate.policies.plugins.candidates import CandidateSetFilter
from kvgate.policies.plugins.deciders import ConditionalDecider, PrefixBasedDecider
from kvgate.policies.plugins.engine_prefix import EnginePrefixBlueprint
from kvgate.policies.plugins.estimated_ttft import EstimatedTtftScorer
from kvgate.policies.plugins.filters import HealthyFilter, LoraFilter, SaturationFilter, SubsetHintFilter
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.plugins.pickers import (
    MaxScorePicker,
    RandomPicker,
    RoundRobinPicker,
    WeightedRandomPicker,
)
from kvgate.policies.plugins.recorders import (
    InflightRecorder,
    OutlierEjectionBlueprint,
    PrefixIndexRecorder,
    Recorder,
    RecorderType,
    SessionRecorder,
)
from kvgate.policies.plugins.scorers import (
    InFlightRequestsScorer,
    InFlightTokensScorer,
    KvCacheUtilizationScorer,
    LoraAffinityScorer,
    PrefixCacheScorer,
    QueueScorer,
    RunningRequestsScorer,
    SessionAffinityScorer,
)
from kvgate.policies.plugins.stored_responses import StoredResponseFilter, StoredResponseRecorder

PluginFactory = Callable[[Mapping[str, Any]], object]
"""Builds one plugin instance from its YAML ``parameters`` (raise ``ConfigError`` on bad ones)."""


class PluginRegistry:
    def __init__(self, factories: Mapping[str, PluginFactory] | None = None) -> None:
        self._factories: dict[str, PluginFactory] = dict(factories or {})

    def register(self, plugin_type: str, factory: PluginFactory) -> None:
        if plugin_type in self._factories:
            raise ConfigError(f"plugin type {plugin_type!r} is already registered")
        self._factories[plugin_type] = factory

    def types(self) -> tuple[str, ...]:
        return tuple(sorted(self._factories))

    def create(self, plugin_type: str, parameters: Mapping[str, Any] | None = None) -> object:
        factory = self._factories.get(plugin_type)
        if factory is None:
            raise ConfigError(f"unknown plugin type {plugin_type!r} (known: {', '.join(self.types())})")
        return factory(parameters or {})


class _NoParams(Params):
    pass


def no_parameters(cls: Callable[[], object], plugin_type: str) -> PluginFactory:
    """A factory for a plugin that takes no parameters (rejects any given)."""

    def build(parameters: Mapping[str, Any]) -> object:
        parse_params(_NoParams, parameters, plugin_type)
        return cls()

    return build


def builtin_registry() -> PluginRegistry:
    """A new registry holding every built-in plugin."""
    registry = PluginRegistry()
    simple: dict[str, Callable[[], object]] = {
        "healthy-filter": HealthyFilter,
        "subset-hint-filter": SubsetHintFilter,
        "stored-response-filter": StoredResponseFilter,
        "lora-filter": LoraFilter,
        "queue-scorer": QueueScorer,
        "kv-cache-utilization-scorer": KvCacheUtilizationScorer,
        "lora-affinity-scorer": LoraAffinityScorer,
        "running-requests-scorer": RunningRequestsScorer,
        "inflight-requests-scorer": InFlightRequestsScorer,
        "inflight-tokens-scorer": InFlightTokensScorer,
        "prefix-cache-scorer": PrefixCacheScorer,
        "session-affinity-scorer": SessionAffinityScorer,
        "weighted-random-picker": WeightedRandomPicker,
        "random-picker": RandomPicker,
        "round-robin-picker": RoundRobinPicker,
    }
    for plugin_type, cls in simple.items():
        registry.register(plugin_type, no_parameters(cls, plugin_type))
    registry.register("saturation-filter", SaturationFilter.from_parameters)
    registry.register("candidate-set", CandidateSetFilter.from_parameters)
    registry.register("estimated-ttft-scorer", EstimatedTtftScorer.from_parameters)
    registry.register("max-score-picker", MaxScorePicker.from_parameters)
    recorders: dict[str, RecorderType] = {
        "inflight-recorder": InflightRecorder,
        "prefix-index-recorder": PrefixIndexRecorder,
        "session-recorder": SessionRecorder,
        "stored-response-recorder": StoredResponseRecorder,
    }
    for plugin_type, recorder in recorders.items():
        registry.register(plugin_type, no_parameters(partial(Recorder, recorder), plugin_type))
    registry.register("outlier-ejection", OutlierEjectionBlueprint.from_parameters)
    registry.register("prefix-based-pd-decider", PrefixBasedDecider.from_parameters)
    registry.register("conditional-pd-decider", ConditionalDecider.from_parameters)
    registry.register("engine-prefix-matches", EnginePrefixBlueprint.from_parameters)
    return registry
