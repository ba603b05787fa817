"""The simulator's chat prompt (``simulator.openai_api.chat_prompt``) as vLLM renders it, checked
against the picker's rendering of the simulated model's template (``policies.model_tokenizer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.simulator import openai_api as api
from kvgate.simulator.file_tokenizer import BUNDLED
from kvgate.simulator.request_fields import ApiError
from kvgate.simulator.tokenizer import encode
from tests.extproc.test_picker_prompt_fuzz import bodies as chat_bodies


def test_the_generation_prompt_and_a_continued_final_message_as_vllm_renders_them() -> None:
    """``add_generation_prompt: false`` leaves the assistant header out; ``continue_final_message``
    (with it false, as vLLM requires) cuts after the last message's content; both true is a 400."""
    chat = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "Once upon "}]
    whole = api.chat_prompt({"messages": chat})
    bare = api.chat_prompt({"messages": chat, "add_generation_prompt": False})
    cut = {"add_generation_prompt": False, "continue_final_message": True}
    continued = api.chat_prompt({"messages": chat, **cut})
    assert len(continued) < len(bare) < len(whole)
    model = ModelTokenizer.load(Path(BUNDLED).parent)
    assert model.chat_template is not None
    for options, tokens in (({"add_generation_prompt": False}, bare),
                            ({"add_generation_prompt": False, "continue_final_message": True}, continued)):
        assert tuple(encode(model.chat_template.render(chat, options=options))) == tokens
    for both in ({"continue_final_message": True}, {**cut, "add_generation_prompt": True}):
        with pytest.raises(ApiError) as err:
            api.chat_prompt({"messages": chat, **both})
        assert err.value.status == 400


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_bodies)
def test_any_chat_body_is_parsed_or_refused_with_a_400(body: dict[str, Any]) -> None:
    """Whatever its messages, parts, tool calls and options hold (the picker's fuzz strategies)."""
    status = 200
    try:
        api.parse_inference("chat", body, "m")
    except ApiError as err:
        status = err.status
    assert status in (200, 400)
