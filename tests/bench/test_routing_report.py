"""bench.routing_report: the goal comparison (best peer, oracle, invalid runs) and the summary of a folder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kvgate.bench.routing import report_command, write_summary
from kvgate.bench.routing_report import compare, goals, summary
from kvgate.bench.run_stats import RunFigures


def run(contender: str, p90: float, tok_s: float = 1000.0, *, rate: float = 100.0, valid: bool = True,
        workload: str = "w") -> RunFigures:
    return RunFigures(
        workload=workload, contender=contender, rate=rate, load_fraction=rate / 200.0, measured=10, ok=10,
        errors=0, sheds=0, ttft_p50_ms=p90 / 2, ttft_p90_ms=p90, ttft_p99_ms=p90 * 2, tpot_p50_ms=5.0,
        tpot_p90_ms=6.0, e2e_p50_s=0.1, e2e_p90_s=0.2, e2e_p99_s=0.3, output_tok_s=tok_s, hit_rate=0.5,
        lag_p99_sim_ms=0.05, client_lag_p99_sim_ms=0.05, valid=valid, policy_check="ok", first_error="")


def test_best_peer_is_neither_kvgate_nor_an_oracle_nor_an_invalid_run() -> None:
    figures = [
        run("envoy-rr", 600.0), run("kvgate-default", 50.0, 1300.0), run("kvgate-gie-default", 40.0),
        run("vllm-router-cache_aware", 30.0, valid=False), run("sglang-router-cache_aware", 65.0, 1200.0),
        run("oracle", 80.0), run("oracle-spill", 55.0),
    ]
    (c,) = compare(figures)
    assert c.best_peer is not None
    assert c.best_peer.contender == "sglang-router-cache_aware"
    assert c.oracle is not None
    assert c.oracle.contender == "oracle-spill"
    assert c.round_robin is not None
    assert c.round_robin.contender == "envoy-rr"
    ratios = (c.p90_ratio(c.best_peer), c.p90_ratio(c.round_robin), c.p90_ratio(c.oracle))
    assert ratios == ("0.77", "0.08", "0.91")
    assert c.throughput_ratio() == "1.08"
    assert "| 100 | sglang-router-cache_aware | 0.77 | 0.08 | 0.91 | 1.08 |" in goals(figures)


def test_one_comparison_per_rate_and_a_missing_subject_is_said() -> None:
    figures = [run("envoy-rr", 100.0, rate=50.0), run("kvgate-default", 20.0, rate=50.0),
               run("envoy-rr", 500.0, rate=150.0), run("kvgate-default", 90.0, rate=150.0, valid=False)]
    low, high = compare(figures)
    assert (low.rate, low.p90_ratio(low.round_robin)) == (50.0, "0.20")
    assert high.subject is None
    assert high.p90_ratio(high.round_robin) == "-"
    assert "(kvgate-default missing or invalid)" in goals(figures)


def test_summary_has_a_row_per_workload_and_rate_with_every_contender_column() -> None:
    fit = [run("envoy-rr", 600.0, 800.0), run("kvgate-default", 50.0, 1300.0), run("oracle", 55.0)]
    lora = [run("envoy-rr", 1400.0, 500.0, workload="lora"),
            run("kvgate-default", 30.0, 1100.0, workload="lora"),
            run("vllm-router-cache_aware", 1300.0, 550.0, workload="lora", valid=False)]
    text = summary([("fit", fit), ("lora", lora)])
    header, _, fit_row, lora_row = text.splitlines()
    assert header.split(" | ")[2:6] == ["envoy-rr", "kvgate-default", "oracle", "vllm-router-cache_aware"]
    assert fit_row == ("| fit | 100 (0.5) | 600.0 (800) | **50.0** (1,300) | 55.0 (1,000) |  "
                       "| 0.08 | 0.08 | 0.91 | 1.62 |")
    assert lora_row == ("| lora | 100 (0.5) | 1,400.0 (500) | **30.0** (1,100) |  | (invalid) "
                        "| 0.02 | 0.02 | - | 2.20 |")


def test_write_summary_reads_every_report_and_skips_other_json(tmp_path: Path) -> None:
    for name, figures in (("fit", [run("envoy-rr", 600.0), run("kvgate-default", 50.0)]),
                          ("lora", [run("envoy-rr", 900.0, workload="lora"),
                                    run("kvgate-default", 30.0, workload="lora")])):
        meta = {"workload": name, "command": f"python -m kvgate.bench.routing --workloads {name}"}
        report = {"meta": meta, "runs": [f.to_json() for f in figures]}
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    (tmp_path / "other.json").write_text(json.dumps({"not": "a report"}))
    write_summary(tmp_path)
    text = (tmp_path / "SUMMARY.md").read_text()
    assert "| fit | 100 (0.5) |" in text
    assert "| lora | 100 (0.5) |" in text
    assert "- [lora](lora.md): `python -m kvgate.bench.routing --workloads lora`" in text
    assert "other.md" not in text


def test_report_command_names_the_rates_and_time_scale_defaults_chose() -> None:
    assert report_command(["--quick", "--workloads", "lora-mix"], [0.9], 20.0) == (
        "python -m kvgate.bench.routing --quick --workloads lora-mix --fractions 0.9 --time-scale 20")
    given = ["--quick", "--fractions", "0.5", "0.9", "--time-scale", "40"]
    assert report_command(given, [0.5, 0.9], 40.0) == "python -m kvgate.bench.routing " + " ".join(given)


def test_the_cpu_table_lists_runs_that_measured_it_with_cost_per_request_and_per_worker() -> None:
    from kvgate.bench.routing_report import tables
    from kvgate.bench.run_stats import RouterCpu

    cpu = RouterCpu(router_s=3.0, router_processes=4, envoy_s=1.0).figures(requests=2000, wall_s=10.0)
    kvgate = dataclasses.replace(run("kvgate-default-w4", 20.0), **cpu)
    envoy = dataclasses.replace(
        run("envoy-rr", 600.0), **RouterCpu(router_s=0.0, router_processes=0, envoy_s=2.0).figures(2000, 10.0)
    )
    text = tables([kvgate, envoy, run("old-json", 50.0)])
    assert "| kvgate-default-w4 | 4 | 0.30 | 1,500 | 0.07 | 0.10 |" in text
    assert "| envoy-rr | - | - | - | - | 0.20 |" in text
    assert "| old-json |" not in text.split("CPU over the run")[1]  # a run from before: no CPU row
    assert "CPU over the run" not in tables([run("old-json", 50.0)])


def test_the_cpu_meter_counts_a_router_tree_s_serving_processes_and_their_cpu() -> None:
    import subprocess
    import sys
    import time

    from kvgate.bench.routing import CpuMeter

    busy = (
        "import time\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\ntime.sleep(5)"
    )
    supervisor = (  # two busy python workers under one parent, like kvgate picker --workers 2
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, '-c', {busy!r}]) for _ in range(2)]\n"
        "[p.wait() for p in ps]"
    )
    parent = subprocess.Popen([sys.executable, "-c", supervisor])
    try:
        time.sleep(0.2)
        meter = CpuMeter([parent.pid], None)
        time.sleep(1.0)
        cpu = meter.read()
    finally:
        parent.kill()
        parent.wait()
    assert cpu.router_processes == 2
    assert cpu.envoy_s is None
    assert 0.2 <= cpu.router_s <= 1.5  # two workers spinning ~0.3 s each, most of it inside the window
