"""bench.extproc_phases: the timing log's parsing, the median of rounds, the report, and a bootstrap
the real Envoy accepts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvgate.bench.extproc_phases import Round, median_of_rounds, phase_medians, phases_bootstrap, render
from kvgate.gateway.processes.envoy_process import find_envoy_binary


def _line(status: int, **fields: object) -> str:
    return json.dumps({"status": status, **fields})


def test_phase_medians_skip_failed_requests_and_absent_phases_and_derive_envoys_own() -> None:
    lines = [
        _line(200, headers_call="100", body_call="50", before_upstream="200", upstream=30, total=300),
        _line(200, headers_call="300", body_call="70", before_upstream="400", upstream=50, total=500),
        _line(200, headers_call="-", body_call=None, before_upstream="90", upstream=40, total=150),
        _line(503, headers_call="9000", body_call="9000", before_upstream="9", upstream=9, total=9),
    ]
    medians = phase_medians(lines)
    assert medians["headers_call"] == 200  # the request without ext_proc phases is not a zero
    assert medians["body_call"] == 60
    assert medians["envoy_own"] == 40  # (200 - 150, 400 - 370): only where both calls were logged
    assert medians["before_upstream"] == 200
    assert medians["total"] == 300
    assert "after_upstream" not in medians


def test_median_of_rounds_and_the_report() -> None:
    rounds = [
        Round("floor", 1000.0, 100, 0, {"headers_call": 300.0, "body_call": 100.0}),
        Round("kvgate_lean", 1500.0, 90, 1, {"headers_call": 400.0, "body_call": 300.0}),
        Round("floor", 1200.0, 110, 0, {"headers_call": 500.0, "body_call": 120.0}),
        Round("kvgate_lean", 1700.0, 80, 0, {"headers_call": 600.0, "body_call": 350.0}),
    ]
    floor = median_of_rounds(rounds, "floor")
    assert (floor.client_p50_us, floor.requests, floor.phases["headers_call"]) == (1100.0, 210, 400.0)
    text = render(rounds, {"command": "test"})
    assert "| floor | 1100 | 400 | 110 | – | – | – | – | – | 210 | 0 |" in text
    assert "| kvgate_lean | 1600 | 500 | 325 | – | – | – | – | – | 170 | 1 |" in text
    assert "direct" not in text.split("Each round")[0].split("| path |")[1]
    # within each round: kvgate_lean − floor = 500 and 500 client, 100 and 100 headers call
    assert "| kvgate_lean − floor | +500 (0 of 2) | +100 (0 of 2) | +215 (0 of 2) | – | – |" in text


def test_differences_pair_kvgate_with_the_baseline_round_by_round() -> None:
    rounds = [
        Round("floor", 1000.0, 1, 0, {}), Round("kvgate_lean", 1500.0, 1, 0, {}),
        Round("baseline_lean", 1600.0, 1, 0, {}),
        Round("baseline_lean", 3000.0, 1, 0, {}), Round("floor", 2000.0, 1, 0, {}),
        Round("kvgate_lean", 3100.0, 1, 0, {}),
        Round("kvgate_lean", 1100.0, 1, 0, {}), Round("baseline_lean", 1400.0, 1, 0, {}),
        Round("floor", 900.0, 1, 0, {}),
    ]
    text = render(rounds, {})
    assert "| kvgate_lean − baseline_lean | -100 (2 of 3) | – | – | – | – |" in text


@pytest.mark.e2e  # runs the Envoy binary (--mode validate): the log format's operators exist
def test_real_envoy_accepts_the_logged_listeners(tmp_path: Path) -> None:
    paths = ("direct", "floor", "kvgate_lean")
    ports = {path: 20000 + index for index, path in enumerate(paths)}
    logs = {path: tmp_path / f"{path}.log" for path in paths}
    pickers = {"floor": ("127.0.0.1", 21000), "kvgate_lean": ("127.0.0.1", 21001)}
    outcomes = {"kvgate_lean": ("127.0.0.1", 21002)}
    config = phases_bootstrap(19999, ports, logs, ["127.0.0.1:22000"], pickers, outcomes)
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps(config))
    result = subprocess.run(
        [str(find_envoy_binary()), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lean = next(item for item in config["static_resources"]["listeners"] if item["name"] == "kvgate_lean")
    names = [log["name"] for log in lean["filter_chains"][0]["filters"][0]["typed_config"]["access_log"]]
    assert names == ["envoy.access_loggers.http_grpc", "envoy.access_loggers.file"]  # reports kept
