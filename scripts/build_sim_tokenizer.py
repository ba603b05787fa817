"""Builds simulator/data/tokenizer.json: a small real tokenizer (Hugging Face ``tokenizers`` format)
for the simulated model, so the simulator (``kvgate sim --tokenizer``) and the picker
(``engine-prefix-matches``) tokenize a prompt alike, as vLLM and a picker loading the model's own
tokenizer do.

Byte-level BPE (every text encodes; no unknown token), trained on a deterministic synthetic corpus
of English-like words (the kind the benchmarks' prompts are made of), 2,048 tokens. Run it to
regenerate the file: ``python scripts/build_sim_tokenizer.py``; nothing downloads anything.
"""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = Path(__file__).resolve().parents[1] / "simulator" / "data" / "tokenizer.json"
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "po", "si", "de", "ba", "the", "and", "ing", "er", "on",
             "re", "an", "st", "en", "at"]


def corpus(lines: int = 4000, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) + "." for _ in range(lines)]


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
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
