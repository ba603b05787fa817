"""A tokenizer file (Hugging Face ``tokenizer.json``) as the replicas' tokenizer (``kvgate sim
--tokenizer FILE``), instead of the simulator's own rule (``simulator.tokenizer``): a router that
loads the same file (kvgate's ``engine-prefix-matches``) then tokenizes prompts exactly as the
replicas do, as a picker that loads the model's tokenizer does against vLLM. Special tokens are
added as the file says (vLLM's default for completions). The repository's own file for the
simulated model: ``simulator/data/tokenizer.json`` (``scripts/build_sim_tokenizer.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

BUNDLED = Path(__file__).resolve().parent / "data" / "tokenizer.json"


def file_encoder(path: str | Path) -> Callable[[str], tuple[int, ...]]:
    """``text`` → its token ids with the tokenizer in ``path``; raises ValueError if it cannot load."""
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise ValueError(f"cannot load tokenizer {str(path)!r}: {exc}") from exc

    def encode(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=True).ids)

    return encode
