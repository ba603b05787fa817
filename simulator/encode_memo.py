"""A bounded memo of tokenizations shared by the replicas of one simulator process.

Why: one process plays a whole fleet on one core, but real replicas each have their own CPU. A
cache-aware router (vllm-router) renders every request on *every* replica before it picks, so a
128 KB prompt was tokenized 8 times (~10 ms each) and its 32k token ids serialized 8 times (~4 ms
each) on the simulator's single event loop: the long-prompts run lagged 2.2 simulated ms and was
invalid. The memo removes that artifact of sharing one CPU; each replica still answers as vLLM
would (same token ids, its own request ids). Not a model of any vLLM cache: nothing here changes
what a replica computes, only how often this process recomputes it.

Bounded by the characters of the texts it holds (oldest dropped first); short texts skip it (they
are cheap to encode and would only churn the memo).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable

from kvgate.simulator import tokenizer

Encode = Callable[[str], tuple[int, ...]]

MIN_CHARS = 4096
"""Texts shorter than this are encoded directly (≤ ~0.3 ms)."""


def encode_direct(text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text))


class EncodeMemo:
    """``memo(text)`` is ``tuple(tokenizer.encode(text))``, remembered for recent long texts."""

    def __init__(self, max_chars: int = 16 * 1024 * 1024, encoder: Encode = encode_direct) -> None:
        """``encoder``: the replicas' tokenizer (the simulator's rule, or a tokenizer file's)."""
        self.max_chars = max_chars
        self._encode = encoder
        self._tokens: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._json: dict[int, str] = {}  # id(a memoised token tuple) -> its JSON; evicted with it
        self._chars = 0
        self.hits = 0
        self.misses = 0

    def uncached(self, text: str) -> tuple[int, ...]:
        """``tokenizer.encode(text)``, not remembered (a text no request sends as it is)."""
        return self._encode(text)

    def __call__(self, text: str) -> tuple[int, ...]:
        if len(text) < MIN_CHARS:
            return self._encode(text)
        tokens = self._tokens.get(text)
        if tokens is not None:
            self._tokens.move_to_end(text)
            self.hits += 1
            return tokens
        self.misses += 1
        tokens = self._encode(text)
        self._tokens[text] = tokens
        self._json[id(tokens)] = ""  # a memoised tuple: its JSON is kept once asked for
        self._chars += len(text)
        while self._chars > self.max_chars and len(self._tokens) > 1:
            old, old_tokens = self._tokens.popitem(last=False)
            del self._json[id(old_tokens)]
            self._chars -= len(old)
        return tokens

    def tokens_json(self, tokens: tuple[int, ...]) -> str:
        """``json.dumps(tokens)``; remembered while ``tokens`` (a tuple this memo returned) is held.

        Keyed by identity: the memo holds every tuple it keys, so an id cannot be reused meanwhile.
        """
        cached = self._json.get(id(tokens))
        if cached:
            return cached
        text = json.dumps(tokens)
        if cached is not None:
            self._json[id(tokens)] = text
        return text

    def __len__(self) -> int:
        return len(self._tokens)
