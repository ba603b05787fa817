"""A request's own latency objectives, from its headers as llm-d's endpoint picker reads them
(sans-IO).

- ``x-slo-ttft-ms``: the time to its first token it asks for, in milliseconds;
- ``x-slo-tpot-ms``: the time per output token after the first.

A value that is not a positive finite number (llm-d's picker parses them the same way and treats
a bad one as absent) leaves the request without that objective: a client's typo never fails its
request. What kvgate does with them: a pool whose flow control orders by ``slo-deadline`` serves
each tenant's held request whose first token is due soonest first (``policies.holding_queue``),
and the picker counts each objective met or missed (``kvgate_request_slo_total``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

TTFT_SLO_HEADER = "x-slo-ttft-ms"
TPOT_SLO_HEADER = "x-slo-tpot-ms"


@dataclass(frozen=True, slots=True)
class LatencyObjectives:
    ttft_s: float | None = None
    """Seconds to the first token (None: no objective)."""
    tpot_s: float | None = None
    """Seconds per output token after the first (None: no objective)."""

    def __bool__(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None


NO_OBJECTIVES = LatencyObjectives()


def latency_objectives(headers: Mapping[str, str]) -> LatencyObjectives:
    """The objectives ``headers`` (lower-cased names) ask for."""
    ttft, tpot = headers.get(TTFT_SLO_HEADER), headers.get(TPOT_SLO_HEADER)
    if ttft is None and tpot is None:
        return NO_OBJECTIVES
    return LatencyObjectives(_seconds(ttft), _seconds(tpot))


def _seconds(milliseconds: str | None) -> float | None:
    if milliseconds is None:
        return None
    try:
        value = float(milliseconds.strip())
    except ValueError:
        return None
    return value / 1000.0 if math.isfinite(value) and value > 0 else None
