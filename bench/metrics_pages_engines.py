"""The fixture pages of the engines other than vLLM (``bench.metrics_pages``): SGLang,
trtllm-serve, JetStream (TPU) and Triton with TensorRT-LLM (prometheus-cpp's format)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import (
    Metric,
)

from kvgate.bench.metrics_families import (
    ITL_BUCKETS,
    MODEL,
    REQUEST_TIME_BUCKETS,
    TTFT_BUCKETS,
    Families,
    one_two_five,
    python_and_process,
    render,
)


def sglang_page() -> str:
    """SGLang with data-parallel attention: two ``dp_rank`` series per gauge (queue 2+5, running 10+12)."""
    fam = Families(7)
    labels = ("dp_rank", "engine_type", "model_name", "pp_rank", "tp_rank")
    rows = [(str(dp), "unified", MODEL, "0", "0") for dp in range(2)]

    def per_rank(a: float, b: float) -> list[tuple[Sequence[str], float]]:
        return [(rows[0], a), (rows[1], b)]

    families = [
        fam.gauge("sglang:num_running_reqs", "The number of running requests.", labels, per_rank(10, 12)),
        fam.gauge("sglang:num_used_tokens", "The number of used tokens.", labels, per_rank(51234, 40211)),
        fam.gauge("sglang:token_usage", "The token usage.", labels, per_rank(0.5, 0.3)),
        fam.gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", labels, per_rank(812.4, 790.2)
        ),
        fam.gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels, per_rank(2, 5)
        ),
        fam.gauge(
            "sglang:num_grammar_queue_reqs",
            "The number of requests in the grammar waiting queue.",
            labels,
            per_rank(0, 0),
        ),
        fam.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", labels, per_rank(0.41, 0.39)),
        fam.gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            labels,
            per_rank(102400, 102400),
        ),
        fam.gauge(
            "sglang:cache_config_info",
            "Information of the SGLang cache config",
            ("dp_rank", "page_size", "num_pages"),
            [(("0", "1", "102400"), 1.0), (("1", "1", "102400"), 1.0)],
        ),
        fam.counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", labels, per_rank(3.1e7, 2.9e7)
        ),
        fam.counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            per_rank(2.2e6, 2.1e6),
        ),
        fam.counter("sglang:num_requests", "Number of requests processed.", labels, per_rank(9120, 9004)),
        fam.histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            rows,
            TTFT_BUCKETS,
            count=9120,
            created=False,
        ),
        fam.histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            rows,
            ITL_BUCKETS,
            count=2200000,
            created=False,
        ),
        fam.histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            labels,
            rows,
            REQUEST_TIME_BUCKETS,
            count=9120,
            created=False,
        ),
    ]
    return render(families)


def trtllm_serve_page() -> str:
    """trtllm-serve (PyTorch backend): waiting 4, running 31, KV 0.72, 32 tokens per block, 8192 blocks."""
    fam = Families(8)
    labels = ("engine_type", "model_name")
    row = ("trtllm", MODEL)
    families = [
        *python_and_process(fam),
        fam.counter(
            "trtllm_request_success",
            "Count of successfully processed requests.",
            ("engine_type", "finished_reason", "model_name"),
            [(("trtllm", "stop", MODEL), 5120.0), (("trtllm", "length", MODEL), 311.0)],
        ),
        fam.histogram(
            "trtllm_e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            [row],
            REQUEST_TIME_BUCKETS,
            count=5431,
        ),
        fam.histogram(
            "trtllm_time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            [row],
            TTFT_BUCKETS,
            count=5431,
        ),
        fam.histogram(
            "trtllm_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            labels,
            [row],
            ITL_BUCKETS,
            count=5431,
        ),
        fam.histogram(
            "trtllm_request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels,
            [row],
            REQUEST_TIME_BUCKETS,
            count=5431,
        ),
        fam.gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate.", labels, [(row, 0.37)]),
        fam.gauge("trtllm_kv_cache_utilization", "KV cache utilization.", labels, [(row, 0.72)]),
        fam.gauge("trtllm_num_requests_waiting", "Number of requests waiting.", labels, [(row, 4.0)]),
        fam.gauge("trtllm_num_requests_running", "Number of requests running.", labels, [(row, 31.0)]),
        fam.gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV cache block.", labels, [(row, 32.0)]),
        fam.gauge(
            "trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks.", labels, [(row, 8192.0)]
        ),
    ]
    return render(families)


JETSTREAM_BUCKETS = {
    "queue_duration": (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0),
    "time_to_first_token": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                            7.5, 10.0),
    "time_per_output_token": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
    "time_per_prefill_token": (0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005,
                               0.01, 0.02, 0.05, 0.1),
    "time_per_request": (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    "wait_time_per_request": (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0),
}
"""JetStream's histogram buckets (jetstream/core/metrics/prometheus.py)."""


def jetstream_page() -> str:
    """JetStream (MaxText engine) with two generate engines: prefill backlog 3, transfer backlogs
    1 + 0, generate backlogs 2 + 0, decode slots used 0.75 and 0.5; the newer families
    (``num_requests_waiting`` 6, ``kv_cache_utilization_perc`` 0.3, ``lora_request_info``); label
    ``id`` the host, ``model_name`` with ``-`` made ``_`` as JetStream does."""
    fam = Families(9)
    labels = ("id", "model_name")
    row = ("jetstream-gemma-0", "gemma_7b")
    per_engine = (*labels, "idx")
    families: list[Metric] = [
        *python_and_process(fam),
        fam.gauge("jetstream_prefill_backlog_size", "Size of prefill queue", labels, [(row, 3.0)]),
        fam.gauge("jetstream_transfer_backlog_size", "Size of transfer queue", per_engine,
                  [((*row, "0"), 1.0), ((*row, "1"), 0.0)]),
        fam.gauge("jetstream_generate_backlog_size", "Size of generate queue", per_engine,
                  [((*row, "0"), 2.0), ((*row, "1"), 0.0)]),
        fam.histogram("jetstream_queue_duration", "The total time each request spends enqueued in seconds",
                      labels, [row], JETSTREAM_BUCKETS["queue_duration"], count=2210),
        fam.gauge("jetstream_slots_used_percentage", "The percentage of decode slots currently being used",
                  per_engine, [((*row, "0"), 0.75), ((*row, "1"), 0.5)]),
        fam.gauge("jetstream_model_load_time", "Total time taken to load the model", labels, [(row, 81.2)]),
        fam.gauge("jetstream_server_startup_latency", "Total time taken to start the Jetstream server",
                  labels, [(row, 96.5)]),
        fam.histogram("jetstream_request_input_length", "Number of input tokens per request", labels, [row],
                      (16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0), count=2210),
        fam.histogram("jetstream_request_output_length", "Number of output tokens per request", labels,
                      [row], one_two_five(2_000_000), count=2204),
        fam.counter("jetstream_request_success_count", "Number of requests successfully completed", labels,
                    [(row, 2204.0)]),
        *(fam.histogram(f"jetstream_{name}", doc, labels, [row], JETSTREAM_BUCKETS[name], count=2204)
          for name, doc in (
              ("time_to_first_token", "Time to first token per request in seconds"),
              ("time_per_output_token", "Average time per output token per request in seconds"),
              ("time_per_prefill_token", "Prefill time per token per request in seconds"),
              ("time_per_request", "End to end request latency in seconds"),
              ("wait_time_per_request", "Time each request is not being prefilled or decoded"))),
        fam.gauge("num_requests_waiting", "Number of requests waiting to be processed for inference.", labels,
                  [(row, 6.0)]),
        fam.gauge("kv_cache_utilization_perc", "kv-cache utilization % by the requests under processing.",
                  labels, [(row, 0.3)]),
        fam.gauge("lora_request_info", "LoRA adapters loaded into HBM for processing requests.",
                  (*labels, "max_lora", "running_lora_adapters"),
                  [((*row, "4", "sql-lora"), 1760000100.0),
                   ((*row, "4", "sql-lora,chat-lora"), 1760000200.0)]),
    ]
    return render(families)


def triton_page() -> str:
    """Triton with TRT-LLM models ``llama`` and ``llama-lora``: waiting 3+1, scheduled 20+6, KV 0.4/0.2."""
    lines: list[str] = []

    def family(name: str, doc: str, kind: str, rows: Iterable[tuple[str, float | int]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {value}" for labels, value in rows)

    models = {"llama": (3, 20, 0.4, 4096, 1638), "llama-lora": (1, 6, 0.2, 4096, 819)}
    for counter in (
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    ):
        family(
            counter,
            "Cumulative inference statistic",
            "counter",
            [
                (f'model="{m}",version="1"', 9811 + i)
                for i, m in enumerate((*models, "ensemble", "preprocessing", "postprocessing"))
            ],
        )
    family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
        [(f'model="{m}",version="1"', 0) for m in models],
    )
    gpu = 'gpu_uuid="GPU-6bd4c4c8-0a5c-3e1f-9e0a-8a6c0b1f2d3e"'
    for name, value in (
        ("nv_gpu_utilization", 0.93),
        ("nv_gpu_memory_total_bytes", 85899345920),
        ("nv_gpu_memory_used_bytes", 76235669504),
        ("nv_gpu_power_usage", 512.3),
        ("nv_gpu_power_limit", 700),
    ):
        family(name, "GPU statistic", "gauge", [(gpu, value)])
    family(
        "nv_energy_consumption",
        "GPU energy consumption in joules since the Triton Server started",
        "counter",
        [(gpu, 8123941.2)],
    )
    family("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge", [("", 0.12)])
    family(
        "nv_trt_llm_request_metrics",
        "TRT LLM request metrics",
        "gauge",
        [
            (f'model="{m}",request_type="{kind}",version="1"', value)
            for m, (waiting, scheduled, *_rest) in models.items()
            for kind, value in (
                ("context", 2),
                ("scheduled", scheduled),
                ("max", 256),
                ("active", waiting + scheduled),
                ("waiting", waiting),
            )
        ],
    )
    family(
        "nv_trt_llm_runtime_memory_metrics",
        "TRT LLM runtime memory metrics",
        "gauge",
        [
            (f'memory_type="{kind}",model="{m}",version="1"', 1073741824)
            for m in models
            for kind in ("pinned", "gpu", "cpu")
        ],
    )
    family(
        "nv_trt_llm_kv_cache_block_metrics",
        "TRT LLM KV cache block metrics",
        "gauge",
        [
            (f'kv_cache_block_type="{kind}",model="{m}",version="1"', value)
            for m, (_w, _s, fraction, max_blocks, used) in models.items()
            for kind, value in (
                ("tokens_per", 64),
                ("used", used),
                ("free", max_blocks - used),
                ("max", max_blocks),
                ("fraction", fraction),
            )
        ],
    )
    family(
        "nv_trt_llm_inflight_batcher_metrics",
        "TRT LLM inflight_batcher-specific metrics",
        "gauge",
        [
            (f'inflight_batcher_specific_metric="{kind}",model="{m}",version="1"', 5)
            for m in models
            for kind in ("micro_batch_id", "generation_requests", "total_context_tokens", "paused_requests")
        ],
    )
    family(
        "nv_trt_llm_general_metrics",
        "General TRT LLM metrics",
        "gauge",
        [
            (f'general_type="{kind}",model="{m}",version="1"', value)
            for m in models
            for kind, value in (("iteration_counter", 912331), ("timestamp", 1760000000123456))
        ],
    )
    return "\n".join(lines) + "\n"


