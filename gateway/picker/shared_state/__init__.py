"""Scheduler state shared by several picker replicas through Redis.

``MirroredState`` (sans-IO) implements ``policies.state.SchedulerState`` over a local mirror;
``SharedStateSync`` keeps the mirrors of every pool in step with Redis in the background, over a
``gateway.picker.redis_link.RedisLink`` (which bounds, counts and survives every Redis call; the tenant
rate limits use the same link). See each module's docstring.
"""

from kvgate.gateway.picker.shared_state.mirror import MirroredState
from kvgate.gateway.picker.shared_state.sync import SharedStateSync, SyncCounters

__all__ = ["MirroredState", "SharedStateSync", "SyncCounters"]
