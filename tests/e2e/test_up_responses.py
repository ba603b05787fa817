"""The OpenAI Responses API, end to end: ``kvgate up -f DIR --sim 2`` through real Envoy, driven by
the OpenAI SDK, the pool publishing KV events and naming the simulated model's directory as its
tokenizer. Each replica holds, behind kvgate's back, a conversation begun with ``responses.create``
(long instructions told apart by their last words). The next turns, sent through the gateway as
vLLM's clients send them (the earlier output as an output message item, then a new user message),
go to the replica that holds their conversation: kvgate must build the prompt as vLLM builds it from
``instructions`` and ``input`` items, token for token. A streamed turn arrives as the SDK's event
stream, the whole response last."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import aiohttp
import openai
import pytest
from openai.types.responses import ResponseInputParam

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from tests.e2e.test_up_engine_prefix import MODEL_DIR, received
from tests.e2e.test_up_kv_events import POOL, endpoints
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e
INSTRUCTIONS = "You keep the harbour's books and answer in one line. " * 20


async def test_a_responses_conversation_goes_where_it_is_held(tmp_path: Path,
                                                             http: aiohttp.ClientSession) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    pool = POOL.format(events=free_port()).replace(
        '{"kvgate.io/kv-events-port"', f'{{"kvgate.io/tokenizer": "{MODEL_DIR}", "kvgate.io/kv-events-port"')
    (config / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.71", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        first, second = sorted(await endpoints(http, up))
        histories: dict[str, tuple[str, ResponseInputParam]] = {}
        for address, ledger in ((first, "the northern ledger"), (second, "the river ledger")):
            instructions = INSTRUCTIONS + f"Today you keep {ledger}."
            question = cast(Any, {"role": "user", "content": [{"type": "input_text", "text": "ships?"}]})
            direct = openai.AsyncOpenAI(base_url=f"http://{address}/v1", api_key="none")  # kvgate unaware
            answer = await direct.responses.create(model=EXAMPLE_MODEL, instructions=instructions,
                                                   input=[question], max_output_tokens=6)
            await direct.close()
            earlier = cast(Any, answer.output[0].model_dump(exclude_none=True))  # the output message, resent
            histories[address] = (instructions, [question, earlier])
        for _ in range(100):  # both followed in step, each holding its conversation
            seen = await endpoints(http, up)
            if all(seen[a]["kv_events"]["in_step"] and seen[a]["kv_events"]["blocks"] >= 20
                   for a in (first, second)):
                break
            await asyncio.sleep(0.05)
        gateway = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="none")
        went: dict[str, list[int]] = {}
        kinds: list[str] = []
        for address in (second, first):
            instructions, history = histories[address]
            before = [await received(http, a) for a in (first, second)]
            turn: ResponseInputParam = [*history, {"role": "user", "content": "and tomorrow?"}]
            reply = await gateway.responses.create(model=EXAMPLE_MODEL, instructions=instructions, input=turn,
                                                   max_output_tokens=4)
            assert reply.usage is not None
            assert reply.usage.input_tokens_details.cached_tokens > 0  # its conversation was there
            stream = await gateway.responses.create(model=EXAMPLE_MODEL, instructions=instructions,
                                                    input=turn, max_output_tokens=4, stream=True)
            kinds = [event.type async for event in stream]
            now = [await received(http, a) for a in (first, second)]
            went[address] = [now[0] - before[0], now[1] - before[1]]
        await gateway.close()
    finally:
        await up.stop()
    assert went == {first: [2, 0], second: [0, 2]}, went
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.count("response.output_text.delta") == 4
    assert kinds[-1] == "response.completed"


async def test_conversations_continued_by_previous_response_id_reach_the_replica_that_stored_them(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM with its response store on keeps each response on the replica that served it and answers
    # a previous_response_id only there (404 elsewhere: three in four turns lost on four replicas)
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "pool.yaml").write_text(POOL.format(events=free_port()))
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=4,
                            sim_hosts_from="127.0.9.91", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        gateway = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="none", max_retries=0)
        chains = [await gateway.responses.create(model=EXAMPLE_MODEL, input=f"conversation {c} begins",
                                                 max_output_tokens=2) for c in range(6)]
        for turn in range(5):
            for c, last in enumerate(chains):
                if (c + turn) % 2:
                    chains[c] = await gateway.responses.create(
                        model=EXAMPLE_MODEL, input=f"turn {turn}", previous_response_id=last.id,
                        max_output_tokens=2)
                else:
                    stream = await gateway.responses.create(
                        model=EXAMPLE_MODEL, input=f"turn {turn}", previous_response_id=last.id,
                        max_output_tokens=2, stream=True)
                    events = [event async for event in stream]
                    assert events[-1].type == "response.completed"
                    chains[c] = events[-1].response
        assert len({chain.id for chain in chains}) == 6
        assert all(chain.usage is not None and chain.usage.input_tokens > 40 for chain in chains)
        for chain in chains:  # read back where it is stored; cancelling it is that replica's 400
            assert (await gateway.responses.retrieve(chain.id)).id == chain.id
            with pytest.raises(openai.BadRequestError):
                await gateway.responses.cancel(chain.id)
        await gateway.close()
        async with http.get(f"{up.admin_url}/metrics") as response:  # each response pinned once
            page = await response.text()
        pins = {line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                if line.startswith("kvgate_session_pins")}
        assert pins == {"kvgate_session_pins": 36, "kvgate_session_pins_dropped_total": 0}, pins
    finally:
        await up.stop()


async def test_two_picker_workers_share_where_responses_are_stored(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kvgate up --workers 2``: a continuation often reaches the other worker than the one that
    picked its response; the pin is shared through Redis as sessions are (within about 0.1 s: a
    client that reads the answer first, as here, is later than that)."""
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(POOL.format(events=free_port()))
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=4, workers=2,
                            sim_hosts_from="127.0.9.101", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        gateway = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="none", max_retries=0)
        chains = [await gateway.responses.create(model=EXAMPLE_MODEL, input=f"conversation {c} begins",
                                                 max_output_tokens=2) for c in range(8)]
        for turn in range(3):
            await asyncio.sleep(0.3)  # the client reads the answers
            for c, last in enumerate(chains):
                chains[c] = await gateway.responses.create(model=EXAMPLE_MODEL, input=f"turn {turn}",
                                                           previous_response_id=last.id, max_output_tokens=2)
        assert all(chain.usage is not None and chain.usage.input_tokens > 40 for chain in chains)
        await gateway.close()
        assert up.workers is not None
        routed = []
        for admin in (up.admin_url, *up.workers.admin_urls):  # both workers picked some of them
            async with http.get(f"{admin}/metrics") as response:
                page = await response.text()
            routed.append(sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                              if line.startswith("inference_objective_request_total{")))
        assert all(count > 0 for count in routed), routed
    finally:
        await up.stop()
