"""bench.datapath.onepass: path selection, the median of latency rounds and the report's columns."""

from __future__ import annotations

from kvgate.bench.datapath.onepass import LATENCY_PATHS, LOAD_PATHS, Row, chosen, median_rows, render


def test_chosen_keeps_direct_and_floor_and_the_named_paths_in_order() -> None:
    assert chosen(LOAD_PATHS, None) == LOAD_PATHS
    assert chosen(LOAD_PATHS, ["kvgate_lean"]) == ("direct", "floor", "kvgate_lean")
    assert chosen(LATENCY_PATHS, ["kvgate_tpm", "kvgate"]) == ("direct", "floor", "kvgate")


def test_median_rows_take_each_figures_median_and_sum_the_errors() -> None:
    rounds = [
        Row("floor", "c=1 1 KB", p50_ms=1.0, rps=100.0),
        Row("floor", "c=1 1 KB", p50_ms=3.0, rps=300.0, errors=1),
        Row("floor", "c=1 1 KB", p50_ms=2.0, rps=200.0),
        Row("floor", "c=1 stream 64", p50_ms=5.0, ttft_p50_ms=1.5),
        Row("floor", "c=1 stream 64", p50_ms=7.0, ttft_p50_ms=2.5),
    ]
    by_case = {row.case: row for row in median_rows(rounds)}
    small = by_case["c=1 1 KB"]
    assert (small.p50_ms, small.rps, small.errors) == (2.0, 200.0, 1)
    assert small.ttft_p50_ms is None
    assert (by_case["c=1 stream 64"].p50_ms, by_case["c=1 stream 64"].ttft_p50_ms) == (6.0, 2.0)


def test_render_shows_only_the_paths_run_and_each_rows_own_processor() -> None:
    rows = []
    for path, base in (("direct", 0.5), ("floor", 1.5), ("kvgate_lean", 2.0)):
        rows += [Row(path, "c=1 1 KB", p50_ms=base), Row(path, "c=1 200 KB", p50_ms=base * 2),
                 Row(path, "c=1 stream 64", p50_ms=base * 3, ttft_p50_ms=base)]
    rows += [
        Row("floor", "c=8 1 KB", rps=1000.0, cpu_us_per_request=300.0, p99_ms=40.0,
            cpu_cores={"processor": 0.3, "null_picker": 0.3}),
        Row("kvgate_lean", "c=8 1 KB", rps=800.0, cpu_us_per_request=450.0, p99_ms=60.0,
            cpu_cores={"processor": 0.36, "picker_lean": 0.36}),
    ]
    text = render(rows, {"command": "test"})
    assert (
        "| request | direct | floor | kvgate_lean | floor added | kvgate_lean added | kvgate_lean − floor |"
    ) in text
    assert "kvgate_gie" not in text.split("## Closed-loop")[0]
    assert "| c=1 1 KB | 0.500 | 1.500 | 2.000 | +1.000 | +1.500 | +0.500 |" in text
    # p99 and its ratio to the floor's; processor, envoy, upstream, picker, picker_lean, null_picker, wrk
    lean = ("| c=8 1 KB | kvgate_lean | 800 | 0.00 | 60.00 | 1.50 | 450 | 1.50 | 0 | 0.36 | 0.00 | 0.00 "
            "| 0.00 | 0.36 |")
    assert lean in text
