"""The fleet's shared tokenization memo: same answers as the tokenizer, bounded, JSON kept with it."""

from __future__ import annotations

import json

from kvgate.simulator import openai_api as api
from kvgate.simulator import tokenizer
from kvgate.simulator.encode_memo import MIN_CHARS, EncodeMemo


def long_text(seed: int, chars: int = 3 * MIN_CHARS) -> str:
    return "".join(f"{seed:04x}{i:08x}" for i in range(chars // 12))


def test_memo_answers_as_the_tokenizer_and_counts_hits() -> None:
    memo = EncodeMemo()
    text = long_text(1)
    first = memo(text)
    assert first == tuple(tokenizer.encode(text))
    assert memo(text) is first
    assert (memo.hits, memo.misses) == (1, 1)
    short = "short prompt"
    assert memo(short) == tuple(tokenizer.encode(short))
    assert len(memo) == 1  # short texts are not kept


def test_memo_is_bounded_by_characters_oldest_first() -> None:
    memo = EncodeMemo(max_chars=2 * 3 * MIN_CHARS)
    texts = [long_text(i) for i in range(3)]
    kept = [memo(t) for t in texts]
    assert len(memo) == 2
    assert memo(texts[2]) is kept[2]
    assert memo(texts[0]) is not kept[0]  # evicted, encoded again
    assert memo(texts[0]) == kept[0]


def test_tokens_json_matches_json_dumps_and_is_dropped_with_its_tokens() -> None:
    memo = EncodeMemo(max_chars=3 * MIN_CHARS)
    tokens = memo(long_text(7))
    text = memo.tokens_json(tokens)
    assert json.loads(text) == list(tokens)
    assert memo.tokens_json(tokens) is text
    other = tuple(range(5000))  # not from the memo: serialised, not kept
    assert json.loads(memo.tokens_json(other)) == list(other)
    memo(long_text(8))  # evicts the first entry and its JSON
    assert memo.tokens_json(tokens) is not text


def test_render_json_is_render_item_with_the_given_token_json() -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 7, "stream": True, "cache_salt": "s"}
    tokens = (5, 6, 7)
    rendered = json.loads(api.render_json("completion", "m", json.dumps(tokens), body))
    expected = api.render_item("completion", "m", tokens, body)
    assert rendered["request_id"].startswith("cmpl-")
    rendered.pop("request_id")
    expected.pop("request_id")
    assert rendered == expected
