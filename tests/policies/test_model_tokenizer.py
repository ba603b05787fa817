"""``policies.model_tokenizer``: a model's tokenizer and chat template loaded from local files and
rendered as transformers renders them for vLLM."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kvgate.policies.errors import ConfigError
from kvgate.policies.model_tokenizer import ChatTemplateError, ModelTokenizer
from kvgate.simulator.tokenizer import render_chat

SIM_MODEL = Path(__file__).resolve().parents[2] / "simulator" / "data"


def model_dir(tmp_path: Path, config: Mapping[str, object], jinja: str | None = None) -> Path:
    (tmp_path / "tokenizer.json").write_bytes((SIM_MODEL / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return tmp_path


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the and "},
     {"role": "assistant", "content": "for are "}, {"role": "user", "content": "but"}],
    [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}},
                                  {"type": "text", "text": "b"}]}],
    [{"role": "assistant", "content": None}, {"content": "no role"}],
])
def test_the_simulated_models_template_renders_what_the_simulator_renders(
    messages: list[dict[str, object]],
) -> None:
    model = ModelTokenizer.load(SIM_MODEL)
    assert model.chat_template is not None
    assert model.chat_template.render(messages) == render_chat(messages)


def test_a_tokenizer_file_alone_has_no_template_and_a_directory_without_one_neither(tmp_path: Path) -> None:
    assert ModelTokenizer.load(SIM_MODEL / "tokenizer.json").chat_template is not None  # its directory's
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((SIM_MODEL / "tokenizer.json").read_bytes())
    assert ModelTokenizer.load(bare).chat_template is None


def test_named_templates_the_jinja_file_first_and_special_tokens_as_added_tokens(tmp_path: Path) -> None:
    config = {"bos_token": {"content": "<s>", "lstrip": False},
              "chat_template": [
                  {"name": "tool_use", "template": "TOOLS"},
                  {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"}]}
    model = ModelTokenizer.load(model_dir(tmp_path, config))
    assert model.chat_template is not None
    assert model.chat_template.render([{"role": "user", "content": "hi"}]) == "<s>hi"
    jinja = "{% for m in messages %}[{{ m['role'] }}]\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    model = ModelTokenizer.load(model_dir(tmp_path, config, jinja))  # chat_template.jinja wins
    assert model.chat_template is not None
    assert model.chat_template.render([{"role": "user", "content": "x"}]) == "[user]\n>"  # trim_blocks


def test_a_template_that_refuses_the_messages_raises_a_template_error(tmp_path: Path) -> None:
    template = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
                "{{ messages | tojson }}")
    model = ModelTokenizer.load(model_dir(tmp_path, {"chat_template": template}))
    assert model.chat_template is not None
    rendered = model.chat_template.render([{"role": "user", "content": "é"}])
    assert rendered == '[{"role": "user", "content": "é"}]'
    with pytest.raises(ChatTemplateError, match="first must be user"):
        model.chat_template.render([{"role": "system", "content": "x"}])
    sandboxed = ModelTokenizer.load(model_dir(tmp_path, {"chat_template": "{{ messages.append(1) }}"}))
    assert sandboxed.chat_template is not None
    with pytest.raises(ChatTemplateError):  # the sandbox refuses to change the messages
        sandboxed.chat_template.render([{"role": "user", "content": "x"}])


def test_what_cannot_load_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        ModelTokenizer.load(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="does not compile"):
        ModelTokenizer.load(model_dir(tmp_path, {"chat_template": "{% for %}"}))
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        ModelTokenizer.load(tmp_path)


def test_transformers_generation_blocks_render_their_body(tmp_path: Path) -> None:
    """``{% generation %}`` (transformers' assistant tracker): a template using it loads and renders
    as transformers renders it (it refused to compile before)."""
    template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
                "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}|{% endfor %}")
    model = ModelTokenizer.load(model_dir(tmp_path, {"chat_template": template}))
    assert model.chat_template is not None
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert model.chat_template.render(chat) == "a|b|"


def test_a_multimodal_models_processor_template_is_taken_when_the_tokenizer_has_none(tmp_path: Path) -> None:
    processor = {"chat_template": "P{{ messages[0]['content'] }}"}
    (tmp_path / "chat_template.json").write_text(json.dumps(processor))
    model = ModelTokenizer.load(model_dir(tmp_path, {}))
    assert model.chat_template is not None
    assert model.chat_template.render([{"role": "user", "content": "x"}]) == "Px"
    tokenizers_own = ModelTokenizer.load(model_dir(tmp_path, {"chat_template": "T"}))
    assert tokenizers_own.chat_template is not None
    assert tokenizers_own.chat_template.render([{"role": "user", "content": "x"}]) == "T"


AGENT_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}},
               {"type": "function", "function": {"name": "search", "description": "the web", "x": 1}}]
AGENT_CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "you are an agent"},
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": None, "refusal": None,
     "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
         {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain"}]},
    {"role": "assistant", "content": "it rains", "tool_calls": []},
]


def test_the_simulated_models_template_renders_tools_and_calls_as_the_simulator_does() -> None:
    """The simulated model's template and the simulator's own rendering (each its own code: the
    picker's ``chat_messages`` and ``vllm_tool``, the simulator's ``vllm_tools`` and argument
    parsing) agree on an agent's conversation: tools in front, calls after ``<|python_tag|>``."""
    from kvgate.simulator.openai_api import vllm_tools

    model = ModelTokenizer.load(SIM_MODEL)
    assert model.chat_template is not None
    picker = model.chat_template.render(AGENT_CHAT, options={"tools": AGENT_TOOLS})
    simulator = render_chat(AGENT_CHAT, tools=vllm_tools(AGENT_TOOLS))
    assert picker == simulator
    assert '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}' in picker
    assert '"description": null' in picker  # vLLM's dump of the first tool
    assert model.chat_template.render(AGENT_CHAT) == render_chat(AGENT_CHAT)  # no tools
