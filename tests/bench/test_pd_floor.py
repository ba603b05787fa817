"""The P/D first-token floor (``bench.pd_floor``): the simulator's engine, one prompt at a time."""

from __future__ import annotations

from kvgate.bench.pd_floor import floor, report
from kvgate.simulator.engine_types import EngineConfig
from kvgate.simulator.kv_transfer import KvTransferSettings


def test_the_floor_is_the_prefill_the_transfer_and_the_decodes_first_step() -> None:
    config = EngineConfig()
    f = floor(8192, KvTransferSettings(), config)
    assert f.prefill_s == f.aggregated_s  # the same prompt on an idle engine, either role
    assert f.transfer_s == KvTransferSettings().transfer_time(512, 16)
    assert 0 < f.decode_s < f.prefill_s / 10  # one step: the last block, not the prompt
    assert f.ratio > 1.0
    faster = floor(8192, KvTransferSettings(bandwidth_gbs=400.0), config)
    assert 1.0 < faster.ratio < f.ratio


def test_the_page_has_a_row_per_length_and_a_column_per_bandwidth() -> None:
    page = report([1024, 4096], [40.0, 100.0])
    assert "| 1,024 |" in page
    assert "| prompt tokens | 40 | 100 |" in page
