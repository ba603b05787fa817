"""Per-tenant rate limits: a sliding-window core (``window``), counter stores in process or in
Redis (``stores``), and the limiter the ext_proc service calls (``limiter``)."""

from kvgate.gateway.picker.ratelimit.limiter import TenantLimits, TenantRateLimiter
from kvgate.gateway.picker.ratelimit.stores import CounterStore, InProcessCounters, RedisCounters
from kvgate.gateway.picker.ratelimit.window import Window, format_duration

__all__ = [
    "CounterStore",
    "InProcessCounters",
    "RedisCounters",
    "TenantLimits",
    "TenantRateLimiter",
    "Window",
    "format_duration",
]
