"""Images in chat requests, as a vLLM multimodal model with a fixed image size takes them (LLaVA-1.5's
shape: one ``<image>`` placeholder per image, expanded to a fixed number of image tokens).

The simulated model's chat template reads a message's content as one string (vLLM's "string" content
format), so vLLM's rule applies: the placeholders of a message's images go in front of its text,
one per image and joined with newlines, unless the text holds them already; more placeholders than
images is a 400 (vLLM's message). The prompt is cut at each placeholder (a special token: the text
on either side is tokenized apart), and each becomes ``image_tokens`` tokens of id
:data:`IMAGE_TOKEN_ID`. An image's identifier is the ``uuid`` the client sent with it (vLLM's
``multi_modal_uuids``) or else a hash of what was sent (standing in for vLLM's hash of the decoded
image); its blocks carry ``(identifier, offset from the block's start)`` in their hashes and in the
KV events' extra keys, as vLLM's do. Audio and video parts are refused (the model takes images).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kvgate.simulator.encode_memo import Encode

IMAGE_PLACEHOLDER = "<image>"
IMAGE_TOKEN_ID = 128_255
"""The image tokens' id (a reserved id of Llama-3's vocabulary; no text encodes to it)."""
DEFAULT_IMAGE_TOKENS = 64

MediaSpan = tuple[str, int, int]
"""An image's identifier, its first image token's index in the prompt and its token count."""

_IMAGE_PARTS = ("image_url", "image_pil", "image_embeds")
_OTHER_MEDIA = {"video_url": "video", "input_audio": "audio", "audio_url": "audio"}


class MediaError(ValueError):
    """A request's media that the model refuses (answered as a 400)."""


def image_identifiers(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The identifier of each image part, in prompt order."""
    found: list[str] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if not isinstance(kind, str):
                continue  # (a client may send anything: not a media part)
            if kind in _OTHER_MEDIA:
                raise MediaError(f"the simulated model takes no {_OTHER_MEDIA[kind]} input")
            if kind not in _IMAGE_PARTS:
                continue
            uuid = part.get("uuid")
            data = part.get(kind)
            if isinstance(uuid, str) and uuid:
                found.append(uuid)
            elif data is None:
                raise MediaError(f"a '{kind}' part without data needs a 'uuid'")
            else:
                digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
                found.append(f"sim-{digest}")
    return found


def with_placeholders(content: object) -> object:
    """A message's content as vLLM gives a "string" template: text parts joined with newlines, a
    placeholder in front for each image the text does not hold one for."""
    if not isinstance(content, list):
        return content
    texts = [part if isinstance(part, str) else part.get("text") for part in content
             if isinstance(part, str) or (isinstance(part, Mapping) and part.get("type", "text") == "text")]
    text = "\n".join(t for t in texts if isinstance(t, str))
    images = sum(1 for part in content if isinstance(part, Mapping) and part.get("type") in _IMAGE_PARTS)
    missing = max(0, images - text.count(IMAGE_PLACEHOLDER))
    return "\n".join([IMAGE_PLACEHOLDER] * missing + [text]) if missing else text


def expand_images(text: str, identifiers: Sequence[str], encode: Encode, image_tokens: int,
                  ) -> tuple[tuple[int, ...], tuple[MediaSpan, ...]]:
    """The prompt's token ids, each placeholder replaced by ``image_tokens`` image tokens, and each
    image's span."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 > len(identifiers):
        raise MediaError(f"Found more '{IMAGE_PLACEHOLDER}' placeholders in input prompt than actual "
                         "multimodal data items.")
    if len(pieces) == 1:
        return encode(text), ()
    tokens: list[int] = list(encode(pieces[0]))
    spans: list[MediaSpan] = []
    for identifier, piece in zip(identifiers, pieces[1:], strict=False):
        spans.append((identifier, len(tokens), image_tokens))
        tokens.extend([IMAGE_TOKEN_ID] * image_tokens)
        tokens.extend(encode(piece))
    return tuple(tokens), tuple(spans)


def block_media(spans: Sequence[MediaSpan], start: int, end: int) -> tuple[tuple[str, int], ...]:
    """The ``(identifier, offset from start)`` of each image the tokens ``[start, end)`` hold part of
    (vLLM's ``_gen_mm_extra_hash_keys`` for one block)."""
    return tuple((ident, offset - start) for ident, offset, count in spans
                 if offset < end and offset + count > start)
