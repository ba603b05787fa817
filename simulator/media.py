"""Images in chat requests, as a vLLM multimodal model with a fixed image size takes them (LLaVA-1.5's
shape: one ``<image>`` placeholder per image, expanded to a fixed number of image tokens), or, with
:class:`ImageGrid`, as Qwen2-VL does: a count per image that follows its size (transformers'
``smart_resize`` to 28-pixel cells within a pixel budget, one token per cell), read from the header
of the image a ``data:`` URL carries.

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

import binascii
import hashlib
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import imagesize

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


@dataclass(frozen=True, slots=True)
class ImageGrid:
    """Qwen2-VL's and Qwen2.5-VL's image processor (their ``preprocessor_config.json``)."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 3_136
    max_pixels: int = 12_845_056

    def tokens(self, width: int, height: int) -> int:
        """vLLM's ``Qwen2VLProcessingInfo._get_vision_info`` for one image (transformers'
        ``smart_resize``, then a token per ``merge_size²`` patches)."""
        if max(width, height) / min(width, height) > 200:
            raise MediaError("absolute aspect ratio must be smaller than 200")
        factor = self.patch_size * self.merge_size
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return (h_bar // self.patch_size) * (w_bar // self.patch_size) // self.merge_size ** 2


ImageTokens = int | ImageGrid
"""Placeholder tokens per image: a fixed count, or Qwen2-VL's count from each image's size."""


def _image_size(part: Mapping[str, Any]) -> tuple[int, int]:
    """The size of an ``image_url`` part's image, from a base64 ``data:`` URL's header."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise MediaError("the simulated model reads images from base64 data: URLs only")
    try:
        data = binascii.a2b_base64(url.partition(",")[2].encode("ascii"))
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MediaError(f"cannot decode the image: {exc}") from exc
    width, height = imagesize.get(io.BytesIO(data), exif_rotation=False)
    if width <= 0 or height <= 0:
        raise MediaError("cannot identify the image file")
    return width, height


def image_token_counts(messages: Sequence[Mapping[str, Any]], image_tokens: ImageTokens) -> list[int]:
    """Each image part's placeholder tokens, in prompt order (``image_identifiers``' order)."""
    parts = [part for message in messages if isinstance(content := message.get("content"), list)
             for part in content if isinstance(part, Mapping) and part.get("type") in _IMAGE_PARTS]
    if isinstance(image_tokens, int):
        return [image_tokens] * len(parts)
    return [image_tokens.tokens(*_image_size(part)) for part in parts]


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


def expand_images(text: str, identifiers: Sequence[str], encode: Encode, counts: Sequence[int],
                  ) -> tuple[tuple[int, ...], tuple[MediaSpan, ...]]:
    """The prompt's token ids, each placeholder replaced by its image's ``counts`` image tokens, and
    each image's span."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 > len(identifiers):
        raise MediaError(f"Found more '{IMAGE_PLACEHOLDER}' placeholders in input prompt than actual "
                         "multimodal data items.")
    if len(pieces) == 1:
        return encode(text), ()
    tokens: list[int] = list(encode(pieces[0]))
    spans: list[MediaSpan] = []
    for identifier, count, piece in zip(identifiers, counts, pieces[1:], strict=False):
        spans.append((identifier, len(tokens), count))
        tokens.extend([IMAGE_TOKEN_ID] * count)
        tokens.extend(encode(piece))
    return tuple(tokens), tuple(spans)


def block_media(spans: Sequence[MediaSpan], start: int, end: int) -> tuple[tuple[str, int], ...]:
    """The ``(identifier, offset from start)`` of each image the tokens ``[start, end)`` hold part of
    (vLLM's ``_gen_mm_extra_hash_keys`` for one block)."""
    return tuple((ident, offset - start) for ident, offset, count in spans
                 if offset < end and offset + count > start)
