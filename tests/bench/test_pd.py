"""The disaggregated-serving benchmark's pure parts: contender names and fleet shapes, the figures of
a run (percentiles, goodput at the SLO), the disaggregated fleet's simulator arguments and the
profile scaling that reaches both halves of a P/D profile."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from kvgate.bench.contenders import scaled_profile
from kvgate.bench.loadgen import RequestResult
from kvgate.bench.pd import contender_and_fleet, figures
from kvgate.bench.pd_report import PdFigures, comparisons, report
from kvgate.bench.run_stats import RouterCpu
from kvgate.bench.workloads import PD_WORKLOADS, FleetSpec, plan

SPEC = PD_WORKLOADS["pd-long"]


def test_a_name_with_a_shape_runs_on_that_split_and_without_on_the_whole_fleet() -> None:
    contender, fleet = contender_and_fleet("kvgate-pd@3p5d", FleetSpec())
    assert (contender.kind, contender.option, contender.name) == ("kvgate", "pd", "kvgate-pd@3p5d")
    assert fleet.roles == ("prefill",) * 3 + ("decode",) * 5
    assert contender.roles == fleet.roles
    assert fleet.args()[:6] == ["--prefill", "3", "--decode", "5", "--replicas", "0"]
    contender, fleet = contender_and_fleet("kvgate-default", FleetSpec())
    assert fleet.roles == ("both",) * 8
    assert contender.option == "default"
    router, _ = contender_and_fleet("vllm-router-pd@4p4d", FleetSpec())
    assert (router.kind, router.option) == ("vllm-router", "pd")
    always, _ = contender_and_fleet("kvgate-pd-always@3p5d", FleetSpec())
    assert always.option.endswith("bench/profiles/pd-always.yaml")  # this repository's profile


def _result(index: int, ttft_s: float, e2e_s: float, tokens: int = 11, status: int = 200) -> RequestResult:
    return RequestResult(index, status, "" if status == 200 else "HTTP 503", 0.0, ttft_s, e2e_s, tokens, 0)


def test_the_figures_count_goodput_within_both_slos() -> None:
    results = [
        _result(0, 9.0, 9.0),  # warm-up: not counted
        _result(1, 0.1, 0.2),  # TTFT 100 ms, TPOT 10 ms: within
        _result(2, 3.0, 3.1),  # TTFT 3 s: outside
        _result(3, 0.1, 1.1),  # TPOT 100 ms: outside
        _result(4, math.nan, 0.0, status=503),
    ]
    stats = {"totals": {"remote_prefills": 7, "remote_decodes": 7, "kv_transfers_failed": 1},
             "loop_lag": {"p99_ms": 0.5}}
    cpu = RouterCpu(router_s=0.01, router_processes=1, envoy_s=0.005)
    f = figures(SPEC, "kvgate-pd@3p5d", FleetSpec().split(3, 5), 4.0, 0.3, results, warmup=1, time_scale=1.0,
                wall_s=10.0, stats=stats, check="ok", slo_ttft_ms=2000, slo_tpot_ms=50, cpu=cpu)
    assert (f.measured, f.ok, f.errors) == (4, 3, 1)
    assert f.ttft_ms[0] == 100.0
    assert f.tpot_ms[2] == 100.0
    assert f.slo_met == 0.25
    assert f.goodput == 1 / (10.0 * 4 / 5)  # one request within, over the measured share of the run
    assert (f.remote_prefills, f.remote_decodes) == (7, 6)
    assert f.fleet == "3 prefill + 5 decode"
    assert (f.router_cpu_us, f.envoy_cpu_us) == (2000.0, 1000.0)
    assert f.valid
    page = report({"command": "x", "date": "d", "machine": "m", "wall_s": 60.0, "seed": 1, "time_scale": 1,
                   "slo_ttft_ms": 2000, "slo_tpot_ms": 50}, [f])
    assert "| kvgate-pd@3p5d | 3 prefill + 5 decode | 3 | 1 | 100 /" in page


def test_unique_prompts_are_long_unique_and_deterministic() -> None:
    first, again = plan(SPEC, 10.0, 3.0, 1), plan(SPEC, 10.0, 3.0, 1)
    assert [r.body for r in first] == [r.body for r in again]
    assert all(4096 <= r.prompt_tokens <= 16384 for r in first)
    assert len({r.body[:200] for r in first}) == len(first)


def test_pd_docs_prompts_share_their_documents_and_differ_in_their_questions() -> None:
    requests = plan(PD_WORKLOADS["pd-docs"], 10.0, 6.0, 1)
    assert all(8192 <= r.prompt_tokens <= 32768 for r in requests)
    assert len({r.body[:200] for r in requests}) < len(requests)  # documents repeat
    assert len({r.body for r in requests}) == len(requests)  # questions differ


def test_scaling_a_pd_profile_scales_both_of_its_halves(tmp_path: Path) -> None:
    out = scaled_profile("pd", 10.0, tmp_path / "pd.yaml")
    document = yaml.safe_load(out.read_text())
    halves = document["disaggregation"]
    for half in ("decode", "prefill"):
        scaled = yaml.safe_load(Path(halves[half]).read_text())
        saturation = next(p for p in scaled["plugins"] if p["type"] == "saturation-filter")
        assert saturation["parameters"]["metrics_staleness_s"] == 2.0  # 0.2 s × 10
        ttft = next(p for p in scaled["plugins"] if p["type"] == "estimated-ttft-scorer")
        assert ttft["parameters"]["time_scale"] == 10.0


def test_scaling_a_conditional_pd_profile_scales_its_decider(tmp_path: Path) -> None:
    """The conditional decider compares its margins (model seconds) with the scorers' estimates
    (clock seconds): unscaled, a 15 x slowed fleet's 50 ms margin would be 3 ms."""
    out = scaled_profile("pd-conditional", 15.0, tmp_path / "pd.yaml")
    decider = yaml.safe_load(out.read_text())["disaggregation"]["decider"]
    assert decider["type"] == "conditional-pd-decider"
    assert decider["parameters"] == {"non_cached_tokens": 1024, "time_scale": 15.0}


def test_the_page_compares_each_pd_run_with_aggregated_kvgate_and_vllm_router_on_its_split() -> None:
    def run(name: str, ttft: float, tpot: float, goodput: float, split: int) -> PdFigures:
        return PdFigures("pd-long", name, "8", 9.0, 0.3, 50, 50, 0, (1.0, ttft, 1.0), (1.0, tpot, 1.0),
                         goodput, 1.0, split, split, 0.1, True, "ok", "")

    runs = [run("kvgate-default", 200.0, 8.0, 10.0, 0), run("kvgate-pd@4p4d", 220.0, 6.0, 10.0, 64),
            run("vllm-router-pd@4p4d", 275.0, 6.0, 10.0, 64), run("kvgate-pd@5p3d", 300.0, 4.0, 5.0, 64)]
    rows = [line for line in comparisons(runs) if line.startswith("| kvgate-")]
    assert rows == ["| kvgate-pd@4p4d | 1.10 | 0.75 | 1.00 | 0.80 | 1.00 | 1.00 |",
                    "| kvgate-pd@5p3d | 1.50 | 0.50 | 0.50 | - | - | - |"]
