"""A model's tokenizer and chat template, as the engine uses them (issue 37; loaded from local files,
never a network call).

``ModelTokenizer.load(path)`` takes a Hugging Face ``tokenizer.json`` or a model directory as vLLM
reads it: ``tokenizer.json`` for the tokens, the chat template from ``chat_template.jinja`` (newer
transformers) or ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named ones:
``default`` is taken), else a multimodal model's processor template (``chat_template.json``); the
special tokens the template names (``bos_token``, ``eos_token``, ...) from ``tokenizer_config.json``.

The chat template is rendered as transformers' ``apply_chat_template`` renders it for vLLM: a
sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension and transformers' ``{% generation %}`` blocks, ``raise_exception``, ``strftime_now`` and
a ``tojson`` filter that keeps non-ASCII text, ``add_generation_prompt`` true. The messages are
given as vLLM gives them (``policies.chat_messages``): each rebuilt from its role, content and the
few fields vLLM keeps, a tool call's arguments parsed; content parts as vLLM's content format for
the template has them (a template that loops over a message's content, the "openai" format, sees
text and ``{"type": "image"}``-like parts; any other, text parts joined with newlines, with the
model's media placeholders in front where the profile names them). The rendered text already holds
the template's BOS, so chat prompts are tokenized without the tokenizer's own special tokens, as
vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from kvgate.policies.chat_messages import vllm_conversation
from kvgate.policies.errors import ConfigError
from kvgate.policies.media import detect_content_format

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                       "mask_token")


def vllm_tool(tool: object) -> object:
    """A ``tools`` entry as vLLM's request model dumps it for the template (``model_dump()`` of
    ``ChatCompletionToolsParam``: ``type``, then ``function`` with ``name``, ``description``,
    ``parameters`` and ``strict``, None where absent, the fields a client added after them)."""
    if not isinstance(tool, Mapping):
        return tool
    function = tool.get("function")
    if isinstance(function, Mapping):
        declared = {"name": function.get("name"), "description": function.get("description"),
                    "parameters": function.get("parameters"), "strict": function.get("strict")}
        function = {**declared, **{k: v for k, v in function.items() if k not in declared}}
    out: dict[str, object] = {"type": tool.get("type", "function"), "function": function}
    out.update({k: v for k, v in tool.items() if k not in out})
    return out


class ChatTemplateError(ValueError):
    """A template that cannot render these messages (the engine would refuse the request too)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlocks(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' ``AssistantTracker``, which marks the
    assistant's tokens for training masks): rendered as its body, as transformers renders it."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it so)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _GenerationBlocks])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ConfigError(f"chat template does not compile: {exc}") from exc
        self._special = dict(special_tokens)
        self.content_format = detect_content_format(source)

    def render(self, messages: Sequence[Mapping[str, Any]],
               placeholders: Mapping[str, str] | None = None,
               options: Mapping[str, Any] | None = None) -> str:
        """The prompt text of ``messages`` with the generation prompt; ChatTemplateError when the
        template refuses them or the messages are not what a template reads. ``placeholders``:
        modality → the text vLLM puts in front of a "string" template's content for one item.
        ``options``: the request's other template inputs (``types.PROMPT_OPTIONS``), as vLLM passes them:
        ``tools`` as its request model dumps them, ``documents``, ``add_generation_prompt`` (default
        true), ``continue_final_message`` (the text cut after the last message's content, as
        transformers cuts it), ``chat_template_kwargs`` as further variables; a request that names
        its own ``chat_template`` is not predicted (ChatTemplateError)."""
        options = options or {}
        if options.get("chat_template") is not None:
            raise ChatTemplateError("the request names its own chat template")
        try:
            converted = vllm_conversation(messages, self.content_format, placeholders or {})
        except ValueError as exc:  # a part vLLM refuses (its 400)
            raise ChatTemplateError(str(exc)) from exc
        tools, extra = options.get("tools"), options.get("chat_template_kwargs")
        for name, value, shape in (("tools", tools, list), ("documents", options.get("documents"), list),
                                   ("chat_template_kwargs", extra, Mapping)):
            if value is not None and not isinstance(value, shape):
                raise ChatTemplateError(f"{name} of a shape vLLM's request model refuses")
        continue_final = options.get("continue_final_message") is True
        add_generation_prompt = options.get("add_generation_prompt", True) is not False and not continue_final
        variables: dict[str, Any] = {**self._special, **(extra if isinstance(extra, Mapping) else {})}
        variables.update(messages=converted, add_generation_prompt=add_generation_prompt,
                         tools=[vllm_tool(t) for t in tools] if isinstance(tools, list) else None,
                         documents=options.get("documents"))
        try:
            rendered = self._template.render(**variables)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        return _continued(rendered, messages) if continue_final else rendered


def _continued(rendered: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """The rendered text cut after the last message's content (transformers'
    ``continue_final_message``: the model continues that message)."""
    final = messages[-1].get("content") if messages else None
    if isinstance(final, list):
        texts = [p.get("text") for p in final if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        final = texts[-1] if texts else None
    if not isinstance(final, str) or final.strip() not in rendered:
        raise ChatTemplateError("continue_final_message: the final message is not in the rendered chat")
    return rendered[: rendered.rindex(final.strip()) + len(final.strip())]


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    path: str

    @staticmethod
    def load(path: str | Path) -> ModelTokenizer:
        """From a ``tokenizer.json`` or a model directory; ConfigError names what is missing or bad."""
        where = Path(path).expanduser()
        directory = where if where.is_dir() else where.parent
        file = where / "tokenizer.json" if where.is_dir() else where
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises its own Exception type for a bad file
            raise ConfigError(f"cannot load tokenizer {str(file)!r}: {exc}") from exc
        return ModelTokenizer(tokenizer, _chat_template(directory), str(where))


def _processor_template(path: Path) -> str | None:
    """A multimodal model's processor template (``chat_template.json``), which vLLM takes when the
    tokenizer has none."""
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    source = loaded.get("chat_template") if isinstance(loaded, dict) else None
    return source if isinstance(source, str) else None


def _chat_template(directory: Path) -> ChatTemplate | None:
    config_path = directory / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            loaded = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {str(config_path)!r}: {exc}") from exc
        if isinstance(loaded, dict):
            config = loaded
    jinja_file = directory / "chat_template.jinja"
    source: object = config.get("chat_template")
    if jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    if isinstance(source, list):  # named templates: the default one
        named = {item.get("name"): item.get("template") for item in source if isinstance(item, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source:
        source = _processor_template(directory / "chat_template.json")
    if not isinstance(source, str) or not source:
        return None
    special: dict[str, str] = {}
    for key in _SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):  # transformers' AddedToken form
            value = value.get("content")
        if isinstance(value, str):
            special[key] = value
    return ChatTemplate(source, special)
