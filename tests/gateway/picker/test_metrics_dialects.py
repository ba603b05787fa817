"""Engine dialects over realistic pages, and the selective parser against prometheus_client's."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.metrics_pages import PAGES, vllm_page
from kvgate.gateway.picker.scrape.dialects import MetricsDialect, parse_metrics
from kvgate.gateway.picker.scrape.exposition import LineMemo, MetricsPageError, parse_labels, read_samples
from kvgate.policies.types import EndpointMetrics

FIXTURES = Path(__file__).parent / "fixtures"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_fixture_files_match_their_generator() -> None:
    for name, render in PAGES.items():
        assert page(name) == render(), f"{name} is stale: python -m kvgate.bench.metrics_pages"


def test_vllm_0_11_page() -> None:
    assert parse_metrics(page("vllm_0_11.prom"), MetricsDialect.VLLM, 12.5) == EndpointMetrics(
        waiting=3,
        running=40,
        kv_cache_usage=pytest.approx(0.6),  # type: ignore[arg-type]
        # The newest lora_requests_info series (value 1760000090.5) sits in the middle of the page.
        active_loras=frozenset({"sql-lora", "chat-lora", "news-lora"}),
        waiting_loras=frozenset({"math-lora"}),
        max_loras=4,
        block_size=16,
        num_gpu_blocks=32931,
        updated_at=12.5,
        served_models=frozenset({"meta-llama/Llama-3.1-8B-Instruct"}),
    )


def test_vllm_legacy_page_falls_back_to_gpu_cache_usage() -> None:
    metrics = parse_metrics(page("vllm_0_6_legacy.prom"), "vllm", 1.0)
    assert (metrics.waiting, metrics.running, metrics.kv_cache_usage) == (2, 7, 0.25)
    assert (metrics.active_loras, metrics.waiting_loras, metrics.max_loras) == (frozenset(), frozenset(), 0)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (16, 11560)


def test_vllm_prefers_kv_cache_usage_over_the_legacy_name() -> None:
    text = "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.3\nvllm:num_requests_waiting 1\n"
    assert parse_metrics(text, "vllm", 0.0).kv_cache_usage == 0.3


def test_vllm_data_parallel_engines_are_summed_and_kv_averaged() -> None:
    metrics = parse_metrics(vllm_page(engines=3), "vllm", 0.0)
    assert (metrics.waiting, metrics.running) == (3 + 4 + 5, 40 + 41 + 42)
    assert metrics.kv_cache_usage == pytest.approx((0.6 + 0.7 + 0.8) / 3)
    assert metrics.num_gpu_blocks == 3 * 32931


def test_vllm_sums_gauges_across_model_name_series() -> None:
    text = (
        'vllm:num_requests_waiting{model_name="a"} 2.0\n'
        'vllm:num_requests_waiting{model_name="b"} 5.0\n'
        'vllm:num_requests_running{model_name="a"} 1.0\n'
        'vllm:num_requests_running{model_name="b"} NaN\n'
    )
    metrics = parse_metrics(text, "vllm", 0.0)
    assert (metrics.waiting, metrics.running) == (7, 1)
    assert metrics.served_models == frozenset({"a", "b"})  # the names adapters are told apart from


def test_vllm_lora_newest_series_wins_and_adapter_lists_are_trimmed() -> None:
    text = (
        "vllm:num_requests_waiting 0\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters=""} 2.0\n'
        'vllm:lora_requests_info{max_lora="3",running_lora_adapters=" a , c ,",waiting_lora_adapters="d"} 3\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="e",waiting_lora_adapters=""} 1.0\n'
    )
    metrics = parse_metrics(text, "vllm", 0.0)
    assert metrics.active_loras == frozenset({"a", "c"})
    assert metrics.waiting_loras == frozenset({"d"})
    assert metrics.max_loras == 3


def test_vllm_lora_equal_timestamps_the_last_series_wins() -> None:
    text = (
        "vllm:num_requests_waiting 0\n"
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="x",waiting_lora_adapters=""} 5\n'
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="y",waiting_lora_adapters=""} 5\n'
    )
    assert parse_metrics(text, "vllm", 0.0).active_loras == frozenset({"y"})


def test_sglang_page_sums_dp_ranks() -> None:
    metrics = parse_metrics(page("sglang.prom"), "sglang", 3.0)
    assert (metrics.waiting, metrics.running) == (7, 22)
    assert metrics.kv_cache_usage == pytest.approx(0.4)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (1, 204800)
    assert metrics.updated_at == 3.0


def test_trtllm_serve_page() -> None:
    metrics = parse_metrics(page("trtllm_serve.prom"), "trtllm", 0.0)
    assert (metrics.waiting, metrics.running, metrics.kv_cache_usage) == (4, 31, 0.72)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (32, 8192)


def test_triton_page_reads_labelled_series_and_sums_models() -> None:
    metrics = parse_metrics(page("triton_trtllm.prom"), "triton", 0.0)
    assert (metrics.waiting, metrics.running) == (3 + 1, 20 + 6)
    assert metrics.kv_cache_usage == pytest.approx(0.3)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (64, 8192)


def test_jetstream_page_queues_are_its_three_backlogs_and_kv_its_decode_slots() -> None:
    """JetStream's page (rendered from its metric definitions, bench/metrics_pages.py): waiting =
    prefill backlog + transfer and generate backlogs per engine; KV = the mean share of decode slots
    in use; no running count; the newest LoRA series."""
    metrics = parse_metrics(page("jetstream.prom"), "jetstream", 4.0)
    assert metrics.waiting == 3 + 1 + 0 + 2 + 0
    assert metrics.kv_cache_usage == pytest.approx(0.625)
    assert (metrics.running, metrics.running_reported) == (0, False)
    assert (metrics.active_loras, metrics.max_loras) == (frozenset({"sql-lora", "chat-lora"}), 4)
    assert metrics.updated_at == 4.0


def test_jetstream_without_its_backlog_families_reads_the_newer_ones() -> None:
    text = 'num_requests_waiting{id="h"} 5\nkv_cache_utilization_perc{id="h"} 0.25\n'
    metrics = parse_metrics(text, "jetstream", 0.0)
    assert (metrics.waiting, metrics.kv_cache_usage) == (5, 0.25)
    only_slots = parse_metrics('jetstream_slots_used_percentage{id="h",idx="0"} 1.5\n', "jetstream", 0.0)
    assert (only_slots.waiting, only_slots.kv_cache_usage) == (0, 1.0)


def test_kv_usage_is_clamped() -> None:
    assert parse_metrics("sglang:token_usage 1.7\n", "sglang", 0.0).kv_cache_usage == 1.0
    assert parse_metrics("sglang:token_usage -0.2\n", "sglang", 0.0).kv_cache_usage == 0.0


@pytest.mark.parametrize(
    ("fixture", "dialect"),
    [
        ("sglang.prom", "vllm"),
        ("vllm_0_11.prom", "sglang"),
        ("vllm_0_11.prom", "trtllm"),
        ("sglang.prom", "triton"),
        ("vllm_0_11.prom", "jetstream"),
        ("jetstream.prom", "vllm"),
    ],
)
def test_a_page_of_another_dialect_is_an_error(fixture: str, dialect: str) -> None:
    with pytest.raises(MetricsPageError):
        parse_metrics(page(fixture), dialect, 0.0)


def test_unknown_dialect_is_rejected() -> None:
    with pytest.raises(ValueError, match="tgi"):
        parse_metrics("x 1\n", "tgi", 0.0)


def test_a_malformed_wanted_line_is_an_error_but_other_lines_are_not_read() -> None:
    assert parse_metrics("garbage{{{ line\nvllm:num_requests_waiting 4\n", "vllm", 0.0).waiting == 4
    with pytest.raises(MetricsPageError):
        parse_metrics("vllm:num_requests_waiting four\n", "vllm", 0.0)
    with pytest.raises(MetricsPageError):
        parse_metrics('vllm:num_requests_waiting{model_name="a} 4\n', "vllm", 0.0)


@pytest.mark.parametrize("limit", [4096, 2])
def test_a_line_memo_gives_what_a_fresh_parse_gives(limit: int) -> None:
    """Pages read one after another through one memo (as a scraper reads its endpoints), each twice,
    read the same as without it; a bounded memo that forgets still does."""
    memo = LineMemo(limit)
    dialects = {"vllm": MetricsDialect.VLLM, "sglang": MetricsDialect.SGLANG,
                "trtllm": MetricsDialect.TRTLLM, "triton": MetricsDialect.TRITON,
                "jetstream": MetricsDialect.JETSTREAM}
    pages = [(page(name), dialect) for name in sorted(PAGES)
             for prefix, dialect in dialects.items() if name.startswith(prefix)]
    assert len(pages) >= 4
    for text, dialect in pages * 2:
        assert parse_metrics(text, dialect, 1.0, memo) == parse_metrics(text, dialect, 1.0)
    assert len(memo.samples) <= limit


def test_a_line_memo_never_answers_for_a_changed_line() -> None:
    memo = LineMemo()
    line = 'vllm:num_requests_waiting{engine="0",model_name="m"} '
    assert parse_metrics(f"{line}3.0\n", "vllm", 0.0, memo).waiting == 3
    assert parse_metrics(f"# HELP x\n{line}5.0\n", "vllm", 0.0, memo).waiting == 5
    assert parse_metrics(f"# HELP x\n{line}3.0\n", "vllm", 0.0, memo).waiting == 3
    with pytest.raises(MetricsPageError):  # a malformed line is not remembered: it fails every time
        parse_metrics("# HELP x\nvllm:num_requests_waiting four\n", "vllm", 0.0, memo)
    with pytest.raises(MetricsPageError):
        parse_metrics("# HELP x\nvllm:num_requests_waiting four\n", "vllm", 0.0, memo)


def test_longer_names_and_comments_do_not_match() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0\n'
        "vllm:num_requests_waiting 1.0\n"
    )
    assert [
        s.value for s in read_samples(text, ["vllm:num_requests_waiting"])["vllm:num_requests_waiting"]
    ] == [1.0]


def test_first_line_timestamps_crlf_and_whitespace() -> None:
    text = 'a{x="1"} 2.5 1700000000000\r\na 3\r\na\t{y="2"}\t4\n'
    samples = read_samples(text, ["a", "missing"])
    assert [(dict(s.labels), s.value) for s in samples["a"]] == [
        ({"x": "1"}, 2.5),
        ({}, 3.0),
        ({"y": "2"}, 4.0),
    ]
    assert samples["missing"] == []


def test_label_values_with_quotes_commas_braces_and_escapes() -> None:
    labels = parse_labels(r'{a="x,y}=z",b="say \"hi\"",c="back\\slash\nnew",d="\q",}')
    assert dict(labels) == {"a": "x,y}=z", "b": 'say "hi"', "c": "back\\slash\nnew", "d": "\\q"}
    with pytest.raises(MetricsPageError):
        parse_labels('{a="x"} trailing')


# -- agreement with prometheus_client's parser ---------------------------------------------------------


Row = tuple[str, tuple[tuple[str, str], ...], float]


def reference_rows(text: str) -> list[Row]:
    return [
        (_as_written(text, s.name), tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _as_written(text: str, name: str) -> str:
    """prometheus_client appends ``_total`` to counters written without it (Triton's): undo that."""
    if name.endswith("_total") and f"\n{name}" not in text and not text.startswith(name):
        return name.removesuffix("_total")
    return name


def fast_rows(text: str, names: set[str]) -> list[Row]:
    found = read_samples(text, names)
    return [(s.name, tuple(sorted(s.labels.items())), s.value) for samples in found.values() for s in samples]


def same(a: list[Row], b: list[Row]) -> bool:
    def key(row: Row) -> tuple[str, tuple[tuple[str, str], ...], str]:
        return row[0], row[1], "nan" if math.isnan(row[2]) else repr(float(row[2]))

    return sorted(map(key, a)) == sorted(map(key, b))


@pytest.mark.parametrize("fixture", sorted(PAGES))
def test_fast_parser_agrees_with_prometheus_client_on_fixture_pages(fixture: str) -> None:
    text = page(fixture)
    expected = reference_rows(text)
    names = {row[0] for row in expected}
    assert len(expected) > 50
    assert same(fast_rows(text, names), expected)
    some = set(sorted(names)[::3])
    assert same(fast_rows(text, some), [row for row in expected if row[0] in some])


_TRICKY = ['"', "\\", "\n", ",", "}", "{", "=", " ", "é", "a", "0", "#", "\t", "le", "_total"]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _random_page(rng: random.Random) -> str:
    lines = []
    names = [f"fam{i}{rng.choice(['', ':x', '_total', '_bucket'])}" for i in range(rng.randint(1, 6))]
    names += [name + "_sum" for name in names[:1]]  # a name that extends another one
    for name in names:
        lines.append(f"# TYPE {name} untyped")
        for _ in range(rng.randint(1, 4)):
            labels = {
                f"l{j}": "".join(rng.choice(_TRICKY) for _ in range(rng.randint(0, 8)))
                for j in range(rng.randint(0, 4))
            }
            rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            value = rng.choice(["1", "0.5", "-3e-2", "NaN", "+Inf", "-Inf", "1.7600000905e+09", "42"])
            lines.append(
                f"{name}{{{rendered}}} {value}" if labels or rng.random() < 0.5 else f"{name} {value}"
            )
    return "\n".join(lines) + "\n"


def test_fast_parser_agrees_with_prometheus_client_on_random_pages() -> None:
    rng = random.Random(20251123)
    for _ in range(300):
        text = _random_page(rng)
        expected = reference_rows(text)
        names = {row[0] for row in expected}
        wanted = set(rng.sample(sorted(names), k=max(1, len(names) // 2)))
        assert same(fast_rows(text, wanted), [row for row in expected if row[0] in wanted]), text
