"""The simulator's speech-to-text API as pure functions: what a form costs, and vLLM's replies."""

from __future__ import annotations

import json

from kvgate.simulator import tokenizer
from kvgate.simulator.audio_api import (
    AUDIO_BYTES_FIELD,
    AUDIO_DIGEST_FIELD,
    ENCODER_POSITIONS,
    TranscriptionReplies,
    TranscriptionShape,
)
from kvgate.simulator.engine_types import Finished


def form(seconds: int, **fields: str) -> dict[str, object]:
    return {AUDIO_BYTES_FIELD: seconds * 32_000, AUDIO_DIGEST_FIELD: "ab" * 16, **fields}


def test_a_form_costs_whispers_windows_and_three_tokens_a_second() -> None:
    shape = TranscriptionShape("served-model")
    short = shape.chat_body(form(2))
    assert short["model"] == "served-model"  # no model: the served one, as vLLM
    content = short["messages"][0]["content"]
    assert tokenizer.count_tokens(content) == ENCODER_POSITIONS
    assert short["max_tokens"] == 6
    assert short["stream"] is False
    long = shape.chat_body(form(31, model="whisper", stream="true", max_completion_tokens="10"))
    long_content = long["messages"][0]["content"]
    assert tokenizer.count_tokens(long_content) == 2 * ENCODER_POSITIONS
    assert long["max_tokens"] == 10
    assert long["model"] == "whisper"
    assert long["stream"] is True


def test_replies_in_vllms_shapes() -> None:
    finished = Finished("r", 0.0, prompt_tokens=1500, completion_tokens=3, cached_tokens=0, ttft=0.1, e2e=0.2)
    replies = TranscriptionReplies("whisper", 2, usage=True)
    assert replies.whole(finished) == {"text": "the and for ", "usage": {"type": "duration", "seconds": 2}}
    closing = replies.closing(None, finished)  # type: ignore[arg-type]  # (the request is not read)
    chunks = (replies.token_chunks(0, 3, final=True) + closing).decode()
    events = [line[6:] for line in chunks.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(event) for event in events[:-1]]
    assert [p["object"] for p in parsed] == ["transcription.chunk"] * 5
    assert "".join(p["choices"][0]["delta"].get("content", "") for p in parsed[:4]) == "the and for "
    assert parsed[3]["choices"][0]["finish_reason"] == "length"
    assert parsed[4]["usage"] == {"prompt_tokens": 1500, "completion_tokens": 3, "total_tokens": 1503}
