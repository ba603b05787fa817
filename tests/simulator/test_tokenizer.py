"""The deterministic 4-characters-per-token tokenizer."""

from __future__ import annotations

from kvgate.simulator.tokenizer import (
    CHARS_PER_TOKEN,
    VOCAB_SIZE,
    count_tokens,
    decode,
    encode,
    output_text,
    render_chat,
)


def test_one_token_per_four_characters_and_deterministic() -> None:
    assert CHARS_PER_TOKEN == 4
    assert encode("") == []
    assert len(encode("abc")) == 1
    assert len(encode("abcd")) == 1
    assert len(encode("abcde")) == 2
    text = "The quick brown fox jumps over the lazy dog. ünïcödé ✓"
    assert encode(text) == encode(text)
    assert len(encode(text)) == count_tokens(text) == -(-len(text) // 4)
    assert all(0 <= t < VOCAB_SIZE for t in encode(text))
    assert encode("abcd") != encode("abce")


def test_prefix_stable_at_multiples_of_four_characters() -> None:
    text = "".join(f"word{i} " for i in range(200))
    tokens = encode(text)
    for cut in (4, 40, 400, 4 * (len(text) // 4)):
        assert tokens[: cut // 4] == encode(text[:cut])


def test_decode_and_output_text_are_four_characters_per_token() -> None:
    tokens = encode("hello world, hello tokens")
    filler = decode(tokens)
    assert len(filler) == 4 * len(tokens)
    assert len(encode(filler)) == len(tokens)
    assert decode(tokens) == filler
    words = [output_text(i) for i in range(100)]
    assert all(len(w) == 4 and w.endswith(" ") for w in words)
    assert len(encode("".join(words))) == 100


def test_chat_template_shares_the_system_prompt_prefix() -> None:
    system = {"role": "system", "content": "You are a helpful assistant. " * 20}
    a = render_chat([system, {"role": "user", "content": "first question"}])
    b = render_chat([system, {"role": "user", "content": [{"type": "text", "text": "other"}]}])
    assert a.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert a.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "<|start_header_id|>user<|end_header_id|>\n\nother<|eot_id|>" in b
    common = len(render_chat([system])) - len("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ta, tb = encode(a), encode(b)
    assert ta[: common // 4] == tb[: common // 4]
    assert ta != tb


def test_chat_content_parts_keep_only_text_joined_by_newlines_as_vllm_joins_them() -> None:
    parts = [{"type": "text", "text": "see "}, {"type": "image_url", "image_url": {"url": "x"}},
             {"type": "text", "text": "this"}]
    assert "see \nthis<|eot_id|>" in render_chat([{"role": "user", "content": parts}])
    assert "\n\n<|eot_id|>" in render_chat([{"role": "assistant", "content": None}])
