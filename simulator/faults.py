"""Fault injection for one simulated replica.

A replica's faults are a small immutable value (:class:`Faults`) held by the replica and replaced
as a whole when changed (at start from ``--replica I:error_rate=…``, at run time through
``POST /sim/faults`` on the replica or ``POST /replicas/{i}/faults`` on the fleet admin server):

- ``error_rate`` (0..1): the fraction of inference requests answered with an injected HTTP 500.
- ``slowdown`` (>= 1 usually): multiplies every engine step's duration, on top of the replica's
  configured ``slowdown`` (a replica that degrades at run time).
- ``metrics_delay_s`` (real seconds): ``GET /metrics`` answers only after this delay.
- ``metrics_frozen``: ``GET /metrics`` keeps serving the page it rendered when frozen.
- ``hang``: inference requests are accepted and never answered (no status, no byte) until the
  client goes away or the fault is cleared; /metrics and the other endpoints answer as usual (an
  engine stuck behind a live HTTP server).
- ``cut_streams``: a streamed response's connection is aborted once half of its ``max_tokens`` were
  sent (no error event, no end of the chunked body: an engine process that died mid-generation);
  non-streamed requests are answered as usual.

Stopping and restarting a replica's listener is not a value here: the fleet does it (see
:mod:`simulator.fleet`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass

FAULT_FIELDS = ("error_rate", "slowdown", "metrics_delay_s", "metrics_frozen", "hang", "cut_streams")
_BOOLEAN_FIELDS = ("metrics_frozen", "hang", "cut_streams")


@dataclass(frozen=True)
class Faults:
    error_rate: float = 0.0
    slowdown: float = 1.0
    metrics_delay_s: float = 0.0
    metrics_frozen: bool = False
    hang: bool = False
    cut_streams: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be within [0, 1], got {self.error_rate}")
        if self.slowdown <= 0.0:
            raise ValueError(f"slowdown must be > 0, got {self.slowdown}")
        if self.metrics_delay_s < 0.0:
            raise ValueError(f"metrics_delay_s must be >= 0, got {self.metrics_delay_s}")

    def updated(self, changes: Mapping[str, object]) -> Faults:
        """A copy with ``changes`` applied; unknown keys or ill-typed values raise ValueError."""
        unknown = sorted(set(changes) - set(FAULT_FIELDS))
        if unknown:
            known = ", ".join(FAULT_FIELDS)
            raise ValueError(f"unknown fault field(s): {', '.join(unknown)}; known: {known}")
        values: dict[str, float | bool] = {}
        for key, raw in changes.items():
            values[key] = _coerce(key, raw)
        return dataclasses.replace(self, **values)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, float | bool]:
        return dataclasses.asdict(self)


def _coerce(key: str, raw: object) -> float | bool:
    if key in _BOOLEAN_FIELDS:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
            return raw.lower() in ("true", "1")
        if isinstance(raw, int):
            return bool(raw)
        raise ValueError(f"{key} must be a boolean, got {raw!r}")
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(f"{key} must be a number, got {raw!r}")
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{key} must be a number, got {raw!r}") from exc


class ErrorInjector:
    """Decides, per request, whether to inject a 500; seeded so a run is reproducible."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def should_fail(self, faults: Faults) -> bool:
        if faults.error_rate <= 0.0:
            return False
        return faults.error_rate >= 1.0 or self._rng.random() < faults.error_rate
