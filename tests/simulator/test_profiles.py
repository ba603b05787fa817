"""Latency profiles as data: the exact BLIS fit and the interpolated H100 measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.simulator.profiles import DEFAULT_PROFILE, MeasuredCost, load_profile, profile_names
from tests.simulator.test_engine_support import formula

CALIBRATION = Path(__file__).parent / "data" / "llama8b_nvidia_h100_80gb_hbm3.json"
"""The H100 measurement the measured profile was built from (one H100 80GB HBM3, Llama-3.1-8B's
decoder shape with random bf16 weights: prefill of one sequence, CUDA-graph decode per batch and
context), kept beside the test so that it checks the packaged profile against its source."""


def test_packaged_profiles() -> None:
    assert profile_names() == ["blis-llama-3.1-8b-h100", "h100-llama-3.1-8b-measured"]
    assert DEFAULT_PROFILE in profile_names()


@pytest.mark.parametrize(("prefill", "decode"), [(0, 1), (2048, 0), (16, 0), (300, 1), (0, 256), (7, 93)])
def test_blis_profile_is_the_formula_exactly(prefill: int, decode: int) -> None:
    profile = load_profile("blis-llama-3.1-8b-h100")
    assert profile.step_time(prefill, decode, max(decode, 1)) == formula(prefill, decode)
    assert profile.step_time(prefill, decode, 1, decode_context=9999) == formula(prefill, decode)


def test_measured_profile_reproduces_its_measurements() -> None:
    profile = load_profile("h100-llama-3.1-8b-measured")
    cost = profile.cost
    assert isinstance(cost, MeasuredCost)
    for point in cost.decode:
        assert profile.step_time(0, point.batch, point.batch, point.context) == pytest.approx(point.ms / 1000)
    assert profile.step_time(2048, 0, 1) == pytest.approx(0.057777)
    assert profile.step_time(16384, 0, 1) == pytest.approx(0.564991)
    # eager overhead makes 16 tokens slower than 128 in the data; the envelope is monotone
    times = [profile.step_time(t, 0, 1) for t in range(1, 20000, 97)]
    assert times == sorted(times)
    assert profile.step_time(16, 0, 1) == pytest.approx(0.009895)
    # decodes plus a prefill: weights are read once
    mixed = profile.step_time(2048, 64, 65, 512)
    assert mixed == pytest.approx((9.436 + 57.777 - 7.127) / 1000)


def test_measured_profile_numbers_are_the_calibration_files() -> None:
    source = json.loads(CALIBRATION.read_text())
    cost = load_profile("h100-llama-3.1-8b-measured").cost
    assert isinstance(cost, MeasuredCost)
    assert [(p.tokens, p.ms) for p in cost.prefill] == [(p["tokens"], p["ms"]) for p in source["prefill"]]
    assert [(p.batch, p.context, p.ms) for p in cost.decode] == [
        (p["batch"], p["context"], p["ms"]) for p in source["decode"]
    ]


def test_load_by_path_and_errors(tmp_path: Path) -> None:
    custom = tmp_path / "mine.json"
    custom.write_text(json.dumps({"name": "mine", "kind": "linear", "base_us": 1000.0,
                                  "prefill_us_per_token": 1.0, "decode_us_per_token": 2.0}))
    profile = load_profile(str(custom))
    assert profile.name == "mine"
    assert profile.step_time(10, 5, 5) == (1000.0 + 10.0 + 10.0) / 1_000_000
    with pytest.raises(ValueError, match="unknown latency profile"):
        load_profile("no-such-profile")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "kind": "linear", "base_us": "fast"}))
    with pytest.raises(ValueError, match="invalid latency profile"):
        load_profile(str(bad))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="Expecting"):  # json.JSONDecodeError is a ValueError
        load_profile(str(broken))
