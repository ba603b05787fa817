"""``kvgate sim --tokenizer FILE``: the replicas tokenize with a tokenizer.json (the repository's
own for the simulated model, built by scripts/build_sim_tokenizer.py)."""

from __future__ import annotations

import dataclasses

import aiohttp
import pytest
from tokenizers import Tokenizer

from kvgate.simulator.file_tokenizer import BUNDLED, file_encoder
from kvgate.simulator.fleet import Fleet
from tests.simulator.conftest import MODEL, fleet_config


def test_the_bundled_file_loads_and_a_bad_one_is_a_clear_error(tmp_path: object) -> None:
    encode = file_encoder(BUNDLED)
    text = "the ledger of the northern harbour"
    assert encode(text) == tuple(Tokenizer.from_file(str(BUNDLED)).encode(text).ids)
    assert 0 < len(encode(text)) < len(text)
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        file_encoder("/no/such/tokenizer.json")


async def test_replicas_count_prompt_tokens_with_the_file(http: aiohttp.ClientSession) -> None:
    fleet = Fleet(dataclasses.replace(fleet_config(1), tokenizer=str(BUNDLED)))
    await fleet.start()
    try:
        text = "the ledger of the northern harbour records every ship " * 10
        async with http.post(fleet.urls[0] + "/v1/completions",
                             json={"model": MODEL, "prompt": text, "max_tokens": 1}) as response:
            usage = (await response.json())["usage"]
        assert usage["prompt_tokens"] == len(file_encoder(BUNDLED)(text))
        assert usage["prompt_tokens"] != -(-len(text) // 4)  # not the simulator's own 4-character rule
    finally:
        await fleet.stop()
