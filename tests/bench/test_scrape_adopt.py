"""``bench.scrape_adopt``: one positive sample per adopted batch."""

from __future__ import annotations

from kvgate.bench import scrape_adopt


def test_one_sample_per_batch() -> None:
    samples = scrape_adopt.measure(20, 5, 12)
    assert len(samples) == 12
    assert all(sample > 0 for sample in samples)
