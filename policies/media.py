"""Images, audio and video in chat requests as vLLM puts them in a prompt (issue 37; sans-IO).

vLLM keys a multimodal prompt's blocks by their tokens and, for each block that holds part of a
media item, by ``(identifier, offset of the item's first placeholder token from the block's
start)`` (``kv_cache_utils._gen_mm_extra_hash_keys``). The identifier is the ``uuid`` the client
sent with the content part, where it sent one (vLLM's ``multi_modal_uuids``: "used to identify the
item for all caching purposes", taken as it is unless processor or tokenization kwargs are given),
else a hash of the decoded media that only the engine can compute. So kvgate predicts a multimodal
prompt's blocks past a media item only where the client named the item (or kvgate did:
``kvgate.io/media-uuids``); before the first item it predicts them as for any prompt, and it stops at
the block holding the first unnamed item (past it, ``engine-prefix-matches`` lets the approximate
index's guess count).

The prompt's tokens: the chat template renders a placeholder for each item, either itself (the
"openai" content format: the template iterates over a message's content parts and sees
``{"type": "image"}`` for an image) or, for templates that read the content as one string (the
"string" format), vLLM puts the model's placeholders in front of the message's text, one per item
and joined with newlines, unless the text holds them already (``chat_utils.
_get_full_multimodal_text_prompt``). The engine's processor then replaces each placeholder by the
item's placeholder tokens. kvgate models the models whose count per item is fixed (LLaVA-1.5: 576
``<image>`` tokens; the simulator's images) and those whose count follows the image's size on
Qwen2-VL's grid (``policies.vision_grid``; sizes read from ``data:`` URLs): ``MediaTokens`` per
modality, from the profile. Other size-dependent models (Pixtral, InternVL's tiles) are not
modelled, and an image given by address has no size here: such items are treated as unnamed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvgate.policies.vision_grid import VisionGrid, data_url_image_size

ContentFormat = Literal["string", "openai"]

MEDIA_PART_TYPES: Mapping[str, str] = {
    "image_url": "image", "image_pil": "image", "image_embeds": "image",
    "video_url": "video", "input_audio": "audio", "audio_url": "audio",
}
"""vLLM's chat content part types that carry a media item → the item's modality."""


@dataclass(frozen=True, slots=True)
class MediaItem:
    modality: str
    identifier: str | None
    """The client's ``uuid`` for the item (the engine's identifier too), or None: the engine hashes
    the decoded media, which kvgate cannot."""
    url: str | None = None
    """An image's URL as sent (a ``data:`` URL's header gives its size)."""


@dataclass(frozen=True, slots=True)
class MediaTokens:
    """How the engine puts one item of a modality into the prompt's tokens."""

    placeholder: str
    """The text the chat template (or vLLM, for a "string" template) puts for one item (``<image>``);
    it must be one special token of the tokenizer, or ``token_id`` given."""
    tokens: int
    """How many placeholder tokens the engine's processor expands one item to (fixed per model)."""
    token_id: int | None = None
    """The expanded tokens' id; None: the placeholder's own (its single token)."""
    grid: VisionGrid | None = None
    """For a model whose count follows the image's size (Qwen2-VL): ``tokens`` is then unused."""

    def count(self, item: MediaItem) -> int | None:
        """How many placeholder tokens ``item`` becomes (None: kvgate cannot tell)."""
        if self.grid is None:
            return self.tokens
        size = data_url_image_size(item.url) if item.url is not None else None
        return self.grid.tokens(*size) if size is not None else None


def is_media_part(part: object) -> bool:
    """A content part that carries a media item (its ``type`` a string: a client may send anything)."""
    if not isinstance(part, Mapping):
        return False
    kind = part.get("type")
    return isinstance(kind, str) and kind in MEDIA_PART_TYPES


def media_items(messages: Sequence[Mapping[str, Any]]) -> list[MediaItem]:
    """The media items of ``messages`` in prompt order (vLLM numbers them per modality in it)."""
    items: list[MediaItem] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if is_media_part(part):
                uuid = part.get("uuid")
                items.append(MediaItem(MEDIA_PART_TYPES[part["type"]],
                                       uuid if isinstance(uuid, str) and uuid else None, _url(part)))
    return items


def _url(part: Mapping[str, Any]) -> str | None:
    """An ``image_url`` part's URL (``{"url": ...}`` or, as vLLM also takes it, a plain string)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    return url if isinstance(url, str) else None


def string_content(content: object, placeholders: Mapping[str, str]) -> object:
    """A message's content as vLLM gives a "string" template: text parts joined with newlines, the
    placeholders of its media items in front of them (those the text does not hold already)."""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    counts: dict[str, int] = {}
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif is_media_part(part):
            placeholder = placeholders.get(MEDIA_PART_TYPES[part["type"]])
            if placeholder is not None:
                counts[placeholder] = counts.get(placeholder, 0) + 1
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    text = "\n".join(texts)
    missing = [p for p, n in counts.items() for _ in range(max(0, n - text.count(p)))]
    return "\n".join([*missing, text]) if missing else text


def detect_content_format(source: str) -> ContentFormat:
    """"openai" when the template loops over a message's content (as vLLM's detection decides:
    a ``for`` over ``...['content']`` or ``....content``), else "string"."""
    try:
        tree = ImmutableSandboxedEnvironment().parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    for loop in tree.find_all(jinja2.nodes.For):
        node: jinja2.nodes.Node = loop.iter
        while isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) and node.node is not None:
            node = node.node
        if isinstance(node, jinja2.nodes.Getattr) and node.attr == "content":
            return "openai"
        if (isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const)
                and node.arg.value == "content"):
            return "openai"
    return "string"
