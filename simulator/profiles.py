"""Latency profiles: how long one engine step takes, as data (``simulator/profiles/*.json``).

A profile file is JSON with ``name``, ``description``, ``source`` and a ``kind``:

- ``"linear"``: ``step = base_us + prefill_us_per_token * P + decode_us_per_token * D`` microseconds,
  where P is the number of *uncached* prompt tokens computed in the step and D the number of sequences
  decoding one token. The default ``blis-llama-3.1-8b-h100`` is the published BLIS fit
  (5752.7 µs + 17.25 µs × P + 6.00 µs × D), evaluated exactly as written.
- ``"measured"``: tables copied from a GPU measurement (``prefill``: ``{tokens, ms}`` for one sequence;
  ``decode``: ``{batch, context, ms}``), interpolated as the file's ``method`` field says and as
  ``MeasuredCost`` implements: prefill piecewise-linear by tokens over the lower monotone envelope of
  the points, decode piecewise-linear by batch then linear by context, the weights read once per
  step. ``h100-llama-3.1-8b-measured`` comes from ``shared/calibration/llama8b_nvidia_h100_80gb_hbm3.json``.

``load_profile`` takes a packaged profile's name or a path to such a file.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import pydantic

PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "blis-llama-3.1-8b-h100"


@dataclass(frozen=True)
class LinearCost:
    """``base_us + prefill_us_per_token * P + decode_us_per_token * D`` microseconds per step."""

    kind: Literal["linear"]
    base_us: float
    prefill_us_per_token: float
    decode_us_per_token: float

    def step_seconds(
        self, prefill_tokens: int, decode_tokens: int, batch_size: int, decode_context: int
    ) -> float:
        us = (
            self.base_us
            + self.prefill_us_per_token * prefill_tokens
            + self.decode_us_per_token * decode_tokens
        )
        return us / 1_000_000


@dataclass(frozen=True)
class PrefillPoint:
    tokens: int
    ms: float


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    context: int
    ms: float


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys): flat below xs[0], the last segment's slope beyond xs[-1]."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = bisect.bisect_right(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class _DecodeRow:
    context: int
    batches: tuple[float, ...]
    ms: tuple[float, ...]


@dataclass(frozen=True)
class MeasuredCost:
    """Step time interpolated from measured prefill and decode tables (see the module docstring)."""

    kind: Literal["measured"]
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("a measured profile needs prefill and decode points")

    @cached_property
    def _prefill_envelope(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        points = sorted(self.prefill, key=lambda p: p.tokens)
        ms: list[float] = []
        lowest = float("inf")
        for p in reversed(points):  # lower monotone envelope: min over this and all longer prompts
            lowest = min(lowest, p.ms)
            ms.append(lowest)
        ms.reverse()
        return tuple(float(p.tokens) for p in points), tuple(ms)

    @cached_property
    def _decode_rows(self) -> tuple[_DecodeRow, ...]:
        rows: list[_DecodeRow] = []
        for context in sorted({p.context for p in self.decode}):
            pts = sorted((p for p in self.decode if p.context == context), key=lambda p: p.batch)
            rows.append(_DecodeRow(context, tuple(float(p.batch) for p in pts), tuple(p.ms for p in pts)))
        return tuple(rows)

    @cached_property
    def weights_ms(self) -> float:
        """The fixed part of any step: decode at batch 1 and the smallest context."""
        return self.decode_ms(1, 0)

    def prefill_ms(self, tokens: int) -> float:
        xs, ys = self._prefill_envelope
        return _interp(xs, ys, tokens)

    def decode_ms(self, batch: int, context: int) -> float:
        rows = self._decode_rows
        per_row = [_interp(r.batches, r.ms, batch) for r in rows]
        return _interp([float(r.context) for r in rows], per_row, context)

    def step_seconds(
        self, prefill_tokens: int, decode_tokens: int, batch_size: int, decode_context: int
    ) -> float:
        if decode_tokens > 0:
            ms = self.decode_ms(decode_tokens, decode_context)
            if prefill_tokens > 0:
                ms += max(0.0, self.prefill_ms(prefill_tokens) - self.weights_ms)
        elif prefill_tokens > 0:
            ms = self.prefill_ms(prefill_tokens)
        else:
            ms = 0.0
        return ms / 1000


@dataclass(frozen=True)
class LatencyProfile:
    """A named step-time model. ``step_time`` returns simulated seconds."""

    name: str
    description: str
    cost: LinearCost | MeasuredCost
    source: str = ""

    def step_time(
        self, prefill_tokens: int, decode_tokens: int, batch_size: int, decode_context: int = 0
    ) -> float:
        """Seconds for a step computing ``prefill_tokens`` uncached prompt tokens and decoding one
        token for each of ``decode_tokens`` sequences (``batch_size`` sequences in all).

        ``decode_context`` (extra, optional) is the mean context length of the decoding sequences;
        only measured profiles use it (0 = unknown: the smallest measured context).
        """
        return self.cost.step_seconds(prefill_tokens, decode_tokens, batch_size, decode_context)


class _ProfileFile(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    name: str
    description: str = ""
    source: str = ""
    cost: LinearCost | MeasuredCost = pydantic.Field(discriminator="kind")


def parse_profile(data: object) -> LatencyProfile:
    """A profile from the decoded JSON of a profile file (raises ``ValueError`` when malformed)."""
    if not isinstance(data, dict):
        raise ValueError("a latency profile is a JSON object")
    fields = {k: v for k, v in data.items() if k in ("name", "description", "source")}
    try:
        parsed = _ProfileFile.model_validate({**fields, "cost": data})
    except pydantic.ValidationError as exc:
        raise ValueError(f"invalid latency profile: {exc}") from exc
    return LatencyProfile(
        name=parsed.name, description=parsed.description, cost=parsed.cost, source=parsed.source
    )


def profile_names() -> list[str]:
    """Names of the packaged profiles."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> LatencyProfile:
    """A packaged profile by name, or a profile file by path."""
    packaged = PROFILE_DIR / f"{name_or_path}.json"
    path = packaged if name_or_path in profile_names() else Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"unknown latency profile {name_or_path!r}; packaged: {', '.join(profile_names())}")
    return parse_profile(json.loads(path.read_text(encoding="utf-8")))  # JSONDecodeError is a ValueError
