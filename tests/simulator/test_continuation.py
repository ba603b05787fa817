"""The ids a reply has where a client resends it (``openai_api.continuation_tokens``): what the
simulated engine caches a request's generated blocks under."""

from __future__ import annotations

import pytest

from kvgate.simulator import openai_api as api
from kvgate.simulator import tokenizer
from kvgate.simulator.file_tokenizer import BUNDLED, file_encoder

HISTORY = [{"role": "system", "content": "you are the harbour master " + "the sea and the ships " * 40},
           {"role": "user", "content": "which ships came in today"}]


@pytest.mark.parametrize("pad", range(4))
def test_a_chats_reply_has_the_ids_the_next_turn_gives_it(pad: int) -> None:
    encode = file_encoder(BUNDLED)
    history = [HISTORY[0], {"role": "user", "content": HISTORY[1]["content"] + " why" * pad}]
    prompt = api.chat_prompt({"messages": history}, encode)
    output = api.continuation_tokens("chat", {"messages": history}, prompt, 24, encode)
    turn2 = [*history, {"role": "assistant", "content": api.output_text(0, 24)},
             {"role": "user", "content": "and tomorrow"}]
    resent = api.chat_prompt({"messages": turn2}, encode)
    assert len(output) == 24
    assert resent[:len(prompt) + 24] == prompt + output


def test_the_simulators_own_rule_gives_ids_only_where_the_prompt_ends_on_a_whole_chunk() -> None:
    history = list(HISTORY)
    while len(tokenizer.render_chat(history)) % 4:
        history[1] = {"role": "user", "content": history[1]["content"] + "x"}
    prompt = api.chat_prompt({"messages": history})
    output = api.continuation_tokens("chat", {"messages": history}, prompt, 8)
    turn2 = [*history, {"role": "assistant", "content": api.output_text(0, 8)}]
    assert api.chat_prompt({"messages": turn2})[len(prompt):len(prompt) + 8] == output
    history[1] = {"role": "user", "content": history[1]["content"] + "x"}  # now cut mid-chunk
    prompt = api.chat_prompt({"messages": history})
    assert api.continuation_tokens("chat", {"messages": history}, prompt, 8) == ()


def test_a_long_completions_reply_follows_its_prompt_and_token_prompts_have_none() -> None:
    encode = file_encoder(BUNDLED)
    text = " ".join(["the ledger of the harbour"] * 2000)  # ~10k tokens: only its tail is tokenized again
    prompt = encode(text)
    output = api.continuation_tokens("completion", {"prompt": text}, prompt, 16, encode)
    longer = encode(text + api.output_text(0, 16))
    assert longer[:len(prompt)] == prompt
    assert longer[len(prompt):len(prompt) + 16] == output
    assert api.continuation_tokens("completion", {"prompt": [1, 2, 3]}, (1, 2, 3), 16, encode) == ()
    # a prompt whose last token merges with the reply's first (a trailing space) has no such ids
    assert api.continuation_tokens("completion", {"prompt": text + " "}, encode(text + " "), 16, encode) == ()
