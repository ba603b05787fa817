"""``ArrivalRate``: requests per second over the last few arrivals, each request counted once."""

from __future__ import annotations

from collections import deque


class ArrivalRate:
    """Arrival rate over the last ``window`` requests (a sliding window of their times).

    ``observe(request_id, now)`` counts a request once however often it is scored (fallbacks, several
    passes); ``per_second()`` is 0 until two arrivals at different times were seen. Times are in the
    caller's clock; ``time_scale`` (clock seconds per cost-model second, 1 in production) converts
    the rate to cost-model seconds.
    """

    def __init__(self, window: int = 64, time_scale: float = 1.0) -> None:
        if window < 2:
            raise ValueError("window must be >= 2")
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self._times: deque[float] = deque(maxlen=window)
        self._last_request: str | None = None
        self._time_scale = time_scale

    def observe(self, request_id: str, now: float) -> None:
        if request_id != self._last_request:
            self._last_request = request_id
            self._times.append(now)

    def per_second(self) -> float:
        times = self._times
        if len(times) < 2:
            return 0.0
        span = times[-1] - times[0]
        return (len(times) - 1) / span * self._time_scale if span > 0 else 0.0
