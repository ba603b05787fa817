"""/metrics parses with prometheus_client and carries docs/metrics.md's names for each engine dialect."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kvgate.simulator.metrics import Dialect
from tests.simulator.conftest import MODEL, FleetFactory

VLLM_NAMES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:cache_config_info",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_count",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_sum",
)
SGLANG_NAMES = (
    "sglang:num_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:token_usage",
    "sglang:cache_config_info",
    "sglang:time_to_first_token_seconds_count",
)
TRTLLM_NAMES = (
    "trtllm_num_requests_waiting",
    "trtllm_num_requests_running",
    "trtllm_kv_cache_utilization",
    "trtllm_kv_cache_tokens_per_block",
    "trtllm_kv_cache_max_blocks",
)
JETSTREAM_NAMES = (
    "jetstream_prefill_backlog_size",
    "jetstream_transfer_backlog_size",
    "jetstream_generate_backlog_size",
    "jetstream_slots_used_percentage",
    "num_requests_waiting",
    "kv_cache_utilization_perc",
    "jetstream_time_to_first_token_count",
)


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, list[Sample]]:
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


async def test_vllm_page_carries_every_protocol_name(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(served_loras=("a", "b"), max_loras=2, num_gpu_blocks=4096)
    url = fleet.urls[0]
    prompt = "x" * 4000
    for _ in range(2):
        async with http.post(
            url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2}
        ):
            pass
    samples = await scrape(http, url)
    for name in VLLM_NAMES:
        assert name in samples, name
    assert samples["vllm:num_requests_waiting"][0].labels == {"model_name": MODEL}
    assert samples["vllm:prompt_tokens_total"][0].value == 2000
    assert samples["vllm:generation_tokens_total"][0].value == 4
    assert samples["vllm:prefix_cache_queries_total"][0].value == 2000
    assert samples["vllm:prefix_cache_hits_total"][0].value == 992  # 62 of 63 blocks (the last is recomputed)
    assert samples["vllm:request_success_total"][0].value == 2
    assert samples["vllm:time_to_first_token_seconds_count"][0].value == 2
    config = samples["vllm:cache_config_info"][0]
    assert config.labels["block_size"] == "16"
    assert config.labels["num_gpu_blocks"] == "4096"
    lora = samples["vllm:lora_requests_info"][0]
    assert set(lora.labels) == {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}
    assert lora.labels["max_lora"] == "2"
    assert lora.value > 1.6e9


async def test_lora_info_lists_running_adapters(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(served_loras=("a", "b"), time_scale=0.5)
    url = fleet.urls[0]
    body = {"model": "a", "prompt": "hi", "max_tokens": 50, "stream": True}
    async with http.post(url + "/v1/completions", json=body) as response:
        await response.content.readuntil(b"\n\n")  # first token made: the adapter is running
        samples = await scrape(http, url)
        newest = max(samples["vllm:lora_requests_info"], key=lambda s: s.value)
        assert newest.labels["running_lora_adapters"] == "a"
        assert samples["vllm:num_requests_running"][0].value == 1
        await response.read()


@pytest.mark.parametrize(("dialect", "names"), [("sglang", SGLANG_NAMES), ("trtllm", TRTLLM_NAMES),
                                               ("jetstream", JETSTREAM_NAMES)])
async def test_other_dialects(
    make_fleet: FleetFactory, http: aiohttp.ClientSession, dialect: Dialect, names: tuple[str, ...]
) -> None:
    fleet = await make_fleet(dialect=dialect)
    async with http.post(
        fleet.urls[0] + "/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 1}
    ):
        pass
    samples = await scrape(http, fleet.urls[0])
    for name in names:
        assert name in samples, name
    assert not any(name.startswith("vllm:") for name in samples)


async def test_frozen_metrics_stop_moving(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    async with http.post(url + "/sim/faults", json={"metrics_frozen": True}) as response:
        assert (await response.json())["metrics_frozen"] is True
    async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 2}):
        pass
    frozen = await scrape(http, url)
    assert frozen["vllm:generation_tokens_total"][0].value == 0
    async with http.post(url + "/sim/faults", json={"metrics_frozen": False}):
        pass
    live = await scrape(http, url)
    assert live["vllm:generation_tokens_total"][0].value == 2
