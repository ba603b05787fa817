"""A pool's scheduler from its profile's name: a :class:`~policies.scheduler.ProfileScheduler`, or a
:class:`~policies.pd_scheduler.DisaggregatedScheduler` for a disaggregated profile."""

from __future__ import annotations

from pathlib import Path

from kvgate.policies.disaggregation import DisaggregatedProfile, load_scheduling
from kvgate.policies.engine_blocks import EngineCacheView
from kvgate.policies.framework import PluginTimer
from kvgate.policies.pd_scheduler import DisaggregatedScheduler
from kvgate.policies.registry import PluginRegistry
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.state import SchedulerState

PoolScheduler = ProfileScheduler | DisaggregatedScheduler


def make_scheduler(
    profile: str | Path,
    registry: PluginRegistry | None = None,
    *,
    state: SchedulerState | None = None,
    timer: PluginTimer | None = None,
    timing_every: int = 1,
    engine_cache: EngineCacheView | None = None,
) -> PoolScheduler:
    """The scheduler of the profile called (or stored at) ``profile``; raises ConfigError."""
    loaded = load_scheduling(profile, registry)
    if isinstance(loaded, DisaggregatedProfile):
        return DisaggregatedScheduler(loaded, state=state, timer=timer, timing_every=timing_every,
                                      engine_cache=engine_cache)
    return ProfileScheduler(loaded, state=state, timer=timer, timing_every=timing_every,
                            engine_cache=engine_cache)
