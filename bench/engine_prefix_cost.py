"""What routing on the engines' reports adds to a pick: ``engine-prefix-matches``' ``prepare`` per
request (tokenize the prompt with the model's tokenizer, key its blocks, look them up in the index
of the engines' reported blocks), at 1k, 8k and 32k-token prompts.

``python -m kvgate.bench.engine_prefix_cost [--requests N] [--endpoints 8] [--tokenizer FILE] [--media]``

Setup: the repository's tokenizer for the simulated model (simulator/data/tokenizer.json, byte-level
BPE) unless given another; ``--endpoints`` endpoints in step, each holding (as its engine reported)
the blocks of 4 of 32 shared system prompts; each measured request is one of the system prompts
followed by a unique 64-token question (a warm prefix: the system prompts' chunks are tokenized
once, at their group's first request, which is timed too). Only ``prepare`` is timed (the rest of
the pick: bench/pick_cost.py). Prints a Markdown table.

``--media``: each request is a chat instead (the model directory's chat template): the system prompt,
then a user message with the group's named image (the simulated model's 64 image tokens) and the
question; the endpoints hold the blocks up to the question as the engine reports them (with the
image's extra keys). The path ``policies.media_prompt`` takes: the whole prompt tokenized (chunks
remembered) and keyed, no lazy tail.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import statistics
import struct
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from kvgate.policies.engine_blocks import EngineBlockIndex
from kvgate.policies.feedback import FeedbackEnv
from kvgate.policies.framework import SchedulingContext
from kvgate.policies.hashing import PromptHasher
from kvgate.policies.media import MediaTokens, media_items
from kvgate.policies.media_prompt import Span, media_prompt_tokens
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.plugins.engine_prefix import EnginePrefixBlueprint
from kvgate.policies.state import InProcessState
from kvgate.policies.types import InferenceRequest
from kvgate.policies.vision_grid import VisionGrid

TOKENIZER = Path(__file__).resolve().parents[1] / "simulator" / "data" / "tokenizer.json"
GROUPS = 32
BLOCK_SIZE = 16
WORDS = ["harbour", "ledger", "ship", "cargo", "north", "river", "grain", "silver", "record", "tide",
         "merchant", "salt", "lantern", "anchor", "rope", "market", "season", "storm", "bridge", "gate"]


class _InStep:
    def __init__(self, index: EngineBlockIndex) -> None:
        self.index = index

    def matches(self, keys: Sequence[int]) -> Mapping[str, int]:
        return self.index.matches(keys)

    def in_step(self, endpoint: str) -> bool:
        return True

    def knows_adapter(self, name: str) -> bool:
        return False

    def held(self, key: int) -> bool:
        return self.index.held(key)

    def tokenizer(self) -> ModelTokenizer | None:
        return None  # the profile's own

    def block_size(self) -> int | None:
        return BLOCK_SIZE

    def key_checked(self, endpoint: str, *, held: bool, trusted: bool) -> None:
        pass  # the benchmark's requests never end


def text_of(rng: random.Random, tokens: int, tokenizer: Tokenizer) -> str:
    """English-like text of about ``tokens`` tokens under the tokenizer."""
    words: list[str] = []
    while True:
        words.extend(rng.choice(WORDS) for _ in range(max(8, tokens // 4)))
        text = " ".join(words)
        if len(tokenizer.encode(text).ids) >= tokens:
            return text


IMAGE = MediaTokens("<image>", 64, 128_255)
"""The simulated model's images (simulator/media.py)."""
GRID_IMAGE = MediaTokens("<image>", 0, 128_255, VisionGrid())
"""``kvgate sim --image-grid``'s: Qwen2-VL's count from each image's size."""


def photo_url(group: int) -> str:
    """A 640 x 480 PNG's data URL of 300 KB (a photo's size; only its header is read)."""
    ihdr = struct.pack(">IIBBBBB", 640, 480, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    body = bytes([group % 256]) * 300_000
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk + body).decode()


def chat(system: str, group: int, question: str, grid: bool = False) -> list[dict[str, object]]:
    url = photo_url(group) if grid else f"data:image/png;base64,{group}"
    image = {"type": "image_url", "image_url": {"url": url}, "uuid": f"img-{group}"}
    return [{"role": "system", "content": system},
            {"role": "user", "content": [image, {"type": "text", "text": question}]}]


def engine_extras(spans: Sequence[Span], blocks: int) -> list[list[list[object]] | None]:
    """vLLM's extra keys of each block: the ``(identifier, offset)`` of each item it holds part of."""
    extras: list[list[list[object]] | None] = []
    for b in range(blocks):
        start = b * BLOCK_SIZE
        held: list[list[object]] = [[i, o - start] for i, o, n in spans
                                    if o < start + BLOCK_SIZE and o + n > start]
        extras.append(held or None)
    return extras


def store_chat(index: EngineBlockIndex, model: ModelTokenizer, system: str, group: int,
               addresses: Sequence[str], grid: bool = False) -> None:
    """What the engines report for a group's chat up to its question."""
    messages = chat(system, group, "", grid)
    assert model.chat_template is not None
    text = model.chat_template.render(messages, {"image": IMAGE.placeholder})
    media = GRID_IMAGE if grid else IMAGE
    prompt = media_prompt_tokens(text, media_items(messages), {"image": media}, {"image": 128_255},
                                 lambda piece: model.tokenizer.encode(piece, add_special_tokens=False).ids)
    assert prompt is not None
    ids, spans = prompt
    blocks = len(ids) // BLOCK_SIZE
    for address in addresses:
        hashes = [(group, address, b) for b in range(blocks)]
        index.stored(address, hashes, None, ids[:blocks * BLOCK_SIZE], BLOCK_SIZE,
                     extra_keys=engine_extras(spans, blocks))


def run(tokens: int, requests: int, endpoints: int, blueprint: EnginePrefixBlueprint,
        media: bool = False, grid: bool = False) -> list[float]:
    assert blueprint.model is not None
    tokenizer = blueprint.model.tokenizer
    rng = random.Random(tokens)
    index = EngineBlockIndex()
    systems = [text_of(rng, tokens - 64, tokenizer) for _ in range(GROUPS)]
    addresses = [f"10.0.0.{i}:8000" for i in range(endpoints)]
    for g, system in enumerate(systems):
        holders = rng.sample(addresses, min(4, endpoints))
        if media:
            store_chat(index, blueprint.model, system, g, holders, grid)
            continue
        ids = tokenizer.encode(system).ids
        whole = len(ids) - len(ids) % BLOCK_SIZE
        for address in holders:
            hashes = [(g, address, b) for b in range(whole // BLOCK_SIZE)]
            index.stored(address, hashes, None, ids[:whole], BLOCK_SIZE)
    state = InProcessState()
    env = FeedbackEnv(state, PromptHasher(256, 512), 7812, "x-session-id", engine_cache=_InStep(index))
    plugin = blueprint.create(env)
    hasher = PromptHasher(256, 512)
    times: list[float] = []
    for i in range(requests):
        question = text_of(rng, 64, tokenizer)
        if media:
            messages = chat(systems[i % GROUPS], i % GROUPS, question, grid)
            request = InferenceRequest(f"r{i}", "bench", "m", "m", prompt=systems[i % GROUPS] + question,
                                       messages=messages)
        else:
            prompt = systems[i % GROUPS] + " " + question
            request = InferenceRequest(f"r{i}", "bench", "m", "m", prompt=prompt)
        ctx = SchedulingContext(request, 0.0, state, rng, hasher)
        start = time.perf_counter()
        plugin.prepare(ctx)
        times.append((time.perf_counter() - start) * 1e6)
    return times


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.engine_prefix_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    parser.add_argument("--media", action="store_true", help="chats with a named image (the model "
                        "directory of --tokenizer must hold the chat template)")
    parser.add_argument("--grid", action="store_true", help="with --media: the image's count follows its "
                        "size (Qwen2-VL's grid), read from a 300 KB data URL's header")
    args = parser.parse_args(argv)
    model = args.tokenizer.parent if args.media else args.tokenizer
    parameters: dict[str, object] = {"tokenizer": str(model)}
    if args.media:
        parameters["media"] = {"image": {"placeholder": IMAGE.placeholder, "token_id": IMAGE.token_id,
                                         **({"grid": {}} if args.grid else {"tokens": IMAGE.tokens})}}
    blueprint = EnginePrefixBlueprint.from_parameters(parameters)
    lines = [
        f"`python -m kvgate.bench.engine_prefix_cost --requests {args.requests} "
        f"--endpoints {args.endpoints}{' --media' if args.media else ''}{' --grid' if args.grid else ''}` "
        f"({os.cpu_count()} cores, "
        f"tokenizer {args.tokenizer.name})", "",
        "| prompt tokens | prepare p50 µs | p90 µs | p99 µs |", "|---|---|---|---|",
    ]
    for tokens in (1024, 8192, 32768):
        times = sorted(run(tokens, args.requests, args.endpoints, blueprint, args.media, args.grid))
        q = statistics.quantiles(times, n=100)
        lines.append(f"| {tokens:,} | {statistics.median(times):,.0f} | {q[89]:,.0f} | {q[98]:,.0f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
