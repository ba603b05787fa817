"""Builds simulator/data/tokenizer.json: a small real tokenizer (Hugging Face ``tokenizers`` format)
for the simulated model, so the simulator (``kvgate sim --tokenizer``) and the picker
(``engine-prefix-matches``) tokenize a prompt alike, as vLLM and a picker loading the model's own
tokenizer do.

Byte-level BPE (every text encodes; no unknown token), trained on a deterministic synthetic corpus
of English-like words and of the simulator's filler words (``simulator.tokenizer.WORDS``: the
replies' text and the routing benchmarks' prompts; each one token, with or without its leading
space, so that text is ~4 characters per token here as under the simulator's own rule), 2,048 tokens.
Run it to regenerate the file: ``python scripts/build_sim_tokenizer.py``; nothing downloads anything.

It writes ``tokenizer_config.json`` beside it: the simulated model's chat template in Jinja (the
Llama-3 layout the simulator renders chats with, ``simulator.tokenizer.render_chat``, with
Llama-3.1's way of putting tools in front and tool calls after ``<|python_tag|>``; a test checks
both give the same text), as a model directory carries it for vLLM and for a router.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvgate.simulator.tokenizer import WORDS

OUT = Path(__file__).resolve().parents[1] / "simulator" / "data" / "tokenizer.json"
CONFIG = OUT.with_name("tokenizer_config.json")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\n\nTools: ' + (tools | tojson) + '<|eot_id|>' }}"
    "{% endif %}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message.get('role', 'user') + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] if message['content'] is not none else '' }}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "{{ '<|python_tag|>' + ({'name': call['function']['name'], 'parameters': call['function']['arguments']}"
    " | tojson) }}{% endfor %}{% endif %}{{ '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "po", "si", "de", "ba", "the", "and", "ing", "er", "on",
             "re", "an", "st", "en", "at"]


def corpus(lines: int = 4000, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(3000)]
    english = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) + "." for _ in range(lines)]
    filler = ["".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) for _ in range(lines)]
    return english + filler


def build() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    build().save(str(OUT))
    CONFIG.write_text(json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                  "chat_template": CHAT_TEMPLATE}, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes) and {CONFIG.name}")
