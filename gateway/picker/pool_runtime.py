"""A pool as the ext_proc service sees it (``extproc.ports.Pool``), its spill chain, and the
immutable table of pools the service swaps on every configuration change."""

from __future__ import annotations

import dataclasses
import random
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvgate.extproc.holding import HoldingArea
from kvgate.extproc.ports import Pool
from kvgate.gateway.picker.pools_file import PoolSpec
from kvgate.gateway.picker.replica_models import PoolModelNames
from kvgate.gateway.picker.scraper import MetricsScraper
from kvgate.policies.contracts import Scheduler
from kvgate.policies.errors import PoolNotFoundError, RouteNotFoundError
from kvgate.policies.flow_control import FlowControlSettings, pool_has_room
from kvgate.policies.schedulers import PoolScheduler
from kvgate.policies.types import EndpointView


@dataclass(frozen=True, slots=True)
class PoolRuntime:
    """One pool as ext_proc sees it (``extproc.ports.Pool``): config plus its scheduler."""

    spec: PoolSpec
    scheduler_impl: PoolScheduler
    scraper: MetricsScraper
    replica_names: Callable[[str, bool], PoolModelNames]
    """What a pool's ready replicas serve (``ReplicaModels.names``)."""
    declared: frozenset[str] = frozenset()
    """``spec.declared_models()``, once."""
    extra_paths: frozenset[str] = frozenset()
    rng: random.Random = field(default_factory=random.Random, compare=False)
    """Draws the weighted model-rewrite target of each request."""
    holding_area: HoldingArea | None = None
    """Where its requests wait for room (flow control on), else None."""
    fallback_pool: PoolRuntime | None = None
    """The next pool of its spill chain (``spec.spill_to``), if any."""
    room: FlowControlSettings = field(default_factory=FlowControlSettings, compare=False)
    """When an endpoint has room: its flow control's settings, else the Inference Extension's
    thresholds alone."""

    @staticmethod
    def of(spec: PoolSpec, scheduler: PoolScheduler, scraper: MetricsScraper,
           replica_names: Callable[[str, bool], PoolModelNames],
           holding: HoldingArea | None = None) -> PoolRuntime:
        room = spec.flow_control.settings() if spec.flow_control is not None else FlowControlSettings()
        return PoolRuntime(spec, scheduler, scraper, replica_names, spec.declared_models(),
                           frozenset(spec.extra_paths), holding_area=holding, room=room)

    @property
    def holding(self) -> HoldingArea | None:
        return self.holding_area

    @property
    def fallback(self) -> PoolRuntime | None:
        return self.fallback_pool

    def has_room(self) -> bool:
        return pool_has_room(self.endpoints(), self.scheduler_impl.state.inflight_by_endpoint(), self.room,
                             time.monotonic())

    def spill_room(self) -> bool:
        """Whether a pool down its spill chain has room."""
        tier = self.fallback_pool
        while tier is not None:
            if tier.has_room():
                return True
            tier = tier.fallback_pool
        return False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def rewrites_models(self) -> bool:
        return bool(self.spec.model_rewrites)

    @property
    def picker_runs_prefill(self) -> bool:
        return self.spec.pd_execution == "picker"

    @property
    def model_server_tls(self) -> ssl.SSLContext | None:
        tls = self.spec.model_server_tls
        return tls.client().context() if tls is not None else None

    @property
    def names_inline_media(self) -> bool:
        return self.spec.media_uuids

    @property
    def honors_model_rewrite_header(self) -> bool:
        return self.spec.model_rewrite_header

    def model_known(self, model: str) -> bool | None:
        if model in self.declared:
            return True
        served = self.replica_names(self.spec.name, False)
        if model in served.names:
            return True
        if self.spec.models:
            return False  # a declared list is the whole list
        if not self.spec.check_models:
            return None
        served = self.replica_names(self.spec.name, True)  # the latest views before saying no
        if model in served.names:
            return True
        return False if served.complete else None

    @property
    def scheduler(self) -> Scheduler:
        return self.scheduler_impl

    def endpoints(self) -> tuple[EndpointView, ...]:
        return self.scraper.snapshot().endpoints(self.spec.name)

    def objective_priority(self, objective: str) -> int | None:
        return self.spec.objective_priority(objective)

    def rewrite_model(self, model: str, headers: Mapping[str, str]) -> str:
        targets = self.spec.rewrite_targets(model)
        if not targets:
            return model
        if len(targets) == 1:
            return targets[0].model
        [target] = self.rng.choices(targets, weights=[t.weight for t in targets])
        return target.model


def with_spill_chains(pools: Mapping[str, PoolRuntime]) -> dict[str, PoolRuntime]:
    """``pools`` each with the runtime of the pool it spills to (and that one's, down the chain;
    a chain stops before a pool it has already passed)."""

    def resolve(name: str, passed: frozenset[str]) -> PoolRuntime:
        pool = pools[name]
        target = pool.spec.spill_to
        if target is None or target in passed or target not in pools:
            return pool
        return dataclasses.replace(pool, fallback_pool=resolve(target, passed | {name}))

    return {name: resolve(name, frozenset()) for name in pools}


@dataclass(frozen=True, slots=True)
class PoolTable:
    """An immutable ``extproc.ports.PoolDirectory``; the service swaps in a new one on change."""

    pools: Mapping[str, PoolRuntime]
    default: str | None

    def resolve(self, name: str | None) -> Pool:
        key = name if name is not None else self.default
        if key is None:
            # Envoy matched no route carrying a pool (e.g. a model no HTTPRoute serves): 404, as the
            # Gateway API answers a request no route matches.
            raise RouteNotFoundError("no route matches this request (is the model served here?)")
        pool = self.pools.get(key)
        if pool is None:
            raise PoolNotFoundError(f"pool {key!r} is not configured")
        return pool
