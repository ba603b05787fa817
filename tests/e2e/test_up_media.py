"""Conversations with images, end to end (issue 37): ``kvgate up -f DIR --sim 2`` through real
Envoy, the pool publishing KV events, naming its model's tokenizer (``kvgate.io/tokenizer``) and a
profile (``kvgate.io/profile``: the default one with ``engine-prefix-matches``' ``media`` as the
simulated model puts images in its prompts). Each replica holds a conversation behind kvgate's back
(sent to it directly) with the same short system prompt and a different named image: all that
tells them apart lies past the image. The next turns of each go to the replica that holds it."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from kvgate.policies.profile import read_profile_document
from kvgate.simulator.media import DEFAULT_IMAGE_TOKENS, IMAGE_PLACEHOLDER, IMAGE_TOKEN_ID
from tests.e2e.test_up_engine_prefix import MODEL_DIR, received
from tests.e2e.test_up_kv_events import POOL, endpoints
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e


def media_profile(path: Path) -> Path:
    document = dict(read_profile_document("default"))
    media = {"image": {"placeholder": IMAGE_PLACEHOLDER, "tokens": DEFAULT_IMAGE_TOKENS,
                       "token_id": IMAGE_TOKEN_ID}}
    document["plugins"] = [
        {**plugin, "parameters": {**(plugin.get("parameters") or {}), "media": media}}
        if plugin["type"] == "engine-prefix-matches" else plugin for plugin in document["plugins"]]
    path.write_text(yaml.safe_dump(document))
    return path


async def chat(http: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": EXAMPLE_MODEL, "messages": messages, "max_tokens": 8}
    async with http.post(f"{url}/v1/chat/completions", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        assert response.status == 200, await response.text()
        reply: str = (await response.json())["choices"][0]["message"]["content"]
    return reply


def opening(photo: str, uuid: str | None) -> list[dict[str, Any]]:
    image: dict[str, Any] = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{photo}"}}
    if uuid is not None:
        image["uuid"] = uuid
    return [{"role": "system", "content": "you look at pictures"},
            {"role": "user", "content": [
                image, {"type": "text", "text": "describe every ship in this picture of the harbour " * 25}]}]


def kvgates_name(photo: str) -> str:
    """The uuid kvgate gives an inline image (``extproc.openai_request.name_inline_media``)."""
    return "kvgate-" + hashlib.sha256(f"data:image/png;base64,{photo}".encode()).hexdigest()


@pytest.mark.parametrize("named_by", ["client", "kvgate"])
async def test_next_turns_go_where_the_conversation_with_their_image_is_held(
    tmp_path: Path, http: aiohttp.ClientSession, named_by: str
) -> None:
    """``client``: every request names its image. ``kvgate``: the pool has ``kvgate.io/media-uuids``
    and the clients send data URLs without a uuid; the conversations held behind kvgate's back were
    sent with the name kvgate gives such an image (its digest), as if kvgate had routed them."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    profile = media_profile(tmp_path / "media.yaml")
    annotations = f'"kvgate.io/tokenizer": "{MODEL_DIR}", "kvgate.io/profile": "{profile}"'
    if named_by == "kvgate":
        annotations += ', "kvgate.io/media-uuids": "true"'
    pool = POOL.format(events=free_port()).replace('{"kvgate.io/kv-events-port"',
                                                   f'{{{annotations}, "kvgate.io/kv-events-port"')
    (config / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.51", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        first, second = sorted(await endpoints(http, up))
        histories: dict[str, list[dict[str, Any]]] = {}
        for address, photo in ((first, "photo-a"), (second, "photo-b")):  # behind kvgate's back
            history = opening(photo, photo if named_by == "client" else kvgates_name(photo))
            reply = await chat(http, f"http://{address}", history)
            histories[address] = [*opening(photo, photo if named_by == "client" else None),
                                  {"role": "assistant", "content": reply}]
        for _ in range(100):  # both followed in step, each holding its conversation
            seen = await endpoints(http, up)
            if all(seen[a]["kv_events"]["in_step"] and seen[a]["kv_events"]["blocks"] >= 30
                   for a in (first, second)):
                break
            await asyncio.sleep(0.05)
        went: dict[str, list[int]] = {}
        for address in (second, first):
            before = [await received(http, a) for a in (first, second)]
            for i in range(2):
                turn = {"role": "user", "content": f"and the crews {i}"}
                await chat(http, up.url, [*histories[address], turn])
            now = [await received(http, a) for a in (first, second)]
            went[address] = [now[0] - before[0], now[1] - before[1]]
    finally:
        await up.stop()
    assert went == {first: [2, 0], second: [0, 2]}, went
