"""A running replica answers the official ``openai`` client, streaming and not, like vLLM."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI, BadRequestError
from openai.types.chat import ChatCompletionMessageParam

from kvgate.simulator.openai_api import MAX_MODEL_LEN
from kvgate.simulator.tokenizer import VOCAB_SIZE
from tests.simulator.conftest import MODEL, FleetFactory

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 100  # ~1,100 tokens


def client_for(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


async def test_completion_non_streaming_reports_exact_length_and_usage(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet()
    async with client_for(fleet.urls[0]) as client:
        result = await client.completions.create(model=MODEL, prompt="Say hello to the world", max_tokens=7)
    assert result.id.startswith("cmpl-")
    assert result.model == MODEL
    assert result.choices[0].finish_reason == "length"
    assert len(result.choices[0].text) == 7 * 4  # 7 tokens of 4 characters
    assert result.usage is not None
    assert result.usage.prompt_tokens == 6  # ceil(22 / 4)
    assert result.usage.completion_tokens == 7
    assert result.usage.total_tokens == 13


async def test_repeated_prompt_reports_cached_tokens(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet()
    async with client_for(fleet.urls[0]) as client:
        first = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
        second = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert 0 < cached < second.usage.prompt_tokens
    assert cached % 16 == 0  # whole blocks only


async def test_chat_non_streaming(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet()
    async with client_for(fleet.urls[0]) as client:
        result = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi there"}], max_completion_tokens=5
        )
    assert result.id.startswith("chatcmpl-")
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert len(result.choices[0].message.content or "") == 20
    assert result.usage is not None
    assert result.usage.completion_tokens == 5


async def test_chat_streaming_with_usage(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet()
    async with client_for(fleet.urls[0]) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) == 6
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6


async def test_completion_streaming_without_usage(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet()
    async with client_for(fleet.urls[0]) as client:
        stream = await client.completions.create(model=MODEL, prompt="count", max_tokens=4, stream=True)
        chunks = [chunk async for chunk in stream]
    assert len(chunks) == 4
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks) == "the and for are "


async def test_lora_adapter_served_by_name(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet(served_loras=("sql-lora",))
    async with client_for(fleet.urls[0]) as client:
        models = await client.models.list()
        result = await client.completions.create(model="sql-lora", prompt="select", max_tokens=3)
    assert [m.id for m in models.data] == [MODEL, "sql-lora"]
    assert result.model == "sql-lora"
    stats = fleet.replicas[0].stats()
    assert stats["requests_served"] == 1


async def test_a_request_past_the_context_is_vllms_400_and_the_replica_serves_on(
    make_fleet: FleetFactory,
) -> None:
    fleet = await make_fleet()
    async with client_for(fleet.urls[0]) as client:
        with pytest.raises(BadRequestError) as huge:
            await client.completions.create(model=MODEL, prompt="Say hello", max_tokens=100_000_000_000)
        too_long: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 140_000}]
        with pytest.raises(BadRequestError) as long_chat:
            await client.chat.completions.create(model=MODEL, messages=too_long, max_completion_tokens=4)
        after = await client.completions.create(model=MODEL, prompt="Say hello", max_tokens=2)
    assert "'max_tokens' or 'max_completion_tokens' is too large: 100000000000." in huge.value.message
    assert f"This model's maximum context length is {MAX_MODEL_LEN} tokens" in huge.value.message
    assert "Please reduce the length of the input messages." in long_chat.value.message
    assert after.usage is not None
    assert after.usage.completion_tokens == 2


async def test_a_token_id_past_the_vocabulary_is_vllms_400(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet()
    async with client_for(fleet.urls[0]) as client:
        with pytest.raises(BadRequestError) as refused:
            await client.completions.create(model=MODEL, prompt=[1, 2, VOCAB_SIZE], max_tokens=2)
        last = await client.completions.create(model=MODEL, prompt=[1, 2, VOCAB_SIZE - 1], max_tokens=2)
    assert f"Token id {VOCAB_SIZE} is out of vocabulary" in refused.value.message
    assert last.usage is not None
    assert last.usage.prompt_tokens == 3
