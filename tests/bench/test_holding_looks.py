"""``bench.holding_looks``: one positive sample per look, the pool full throughout."""

from __future__ import annotations

import asyncio

from kvgate.bench import holding_looks


def test_one_sample_per_look() -> None:
    samples = asyncio.run(holding_looks.measure(8, 25))
    assert len(samples) == 25
    assert all(sample > 0 for sample in samples)
