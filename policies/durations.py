"""Go durations (``50ms``, ``1m30s``), as the Inference Extension's and llm-d's flags, configs and
headers write them."""

from __future__ import annotations

import re

_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_duration(text: str) -> float:
    """Seconds of a Go duration (``50ms``, ``1m30s``, ``1.5s``); ValueError for anything else."""
    value = text.strip().strip('"')
    parts = _GO_DURATION.findall(value)
    if not parts or "".join(number + unit for number, unit in parts) != value:
        raise ValueError(f"not a duration: {text!r} (e.g. 50ms, 2s)")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)
