"""Sliding-window counting over time buckets (pure; no IO, no clock of its own).

A window of ``seconds`` is split into ``buckets`` equal buckets numbered ``floor(t / bucket_s)``
(wall-clock time, so every picker replica numbers them alike). The count "in the last window" at
time ``now`` is the sliding-window-counter estimate: every bucket that started within the window in
full, plus the bucket that is sliding out weighted by the share of it still inside the window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    seconds: float = 60.0
    buckets: int = 12

    def __post_init__(self) -> None:
        if self.seconds <= 0 or self.buckets < 1:
            raise ValueError("a window needs a positive length and at least one bucket")

    @property
    def bucket_s(self) -> float:
        return self.seconds / self.buckets

    def bucket(self, now: float) -> int:
        return math.floor(now / self.bucket_s)

    def oldest_live(self, now: float) -> int:
        """The oldest bucket that still counts at ``now`` (older ones can be dropped)."""
        return self.bucket(now) - self.buckets

    def total(self, counts: Mapping[int, int], now: float) -> float:
        current = self.bucket(now)
        oldest = current - self.buckets
        inside = 1.0 - (now / self.bucket_s - current)  # share of the oldest bucket still in the window
        total = 0.0
        for bucket, count in counts.items():
            if oldest < bucket <= current:
                total += count
            elif bucket == oldest:
                total += inside * count
        return total

    def wait_until_below(self, counts: Mapping[int, int], now: float, limit: float) -> float:
        """Seconds until the count drops below ``limit`` if nothing new arrives (0 if it already is)."""
        if self.total(counts, now) < limit:
            return 0.0
        step = self.bucket_s / 20
        waited = step
        while waited <= self.seconds + self.bucket_s:
            if self.total(counts, now + waited) < limit:
                return waited
            waited += step
        return self.seconds


def format_duration(seconds: float) -> str:
    """OpenAI's style for ``x-ratelimit-reset-*``: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{text}s" if minutes else f"{text}s"
