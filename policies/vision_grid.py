"""Image token counts that depend on the image's size: Qwen2-VL's and Qwen2.5-VL's dynamic
resolution, as vLLM counts them (issue 37; sans-IO).

vLLM's ``Qwen2VLProcessingInfo._get_vision_info``: the image is resized by transformers'
``smart_resize`` to multiples of ``patch_size × merge_size`` (28) with its pixels kept within
``[min_pixels, max_pixels]`` (the model's ``preprocessor_config.json``: 3,136 and 12,845,056 for
Qwen2-VL and Qwen2.5-VL), cut into ``patch_size`` patches, and every ``merge_size²`` patches
become one ``<|image_pad|>`` token: ``(height' / 28) × (width' / 28)`` tokens. The count is the
same for an image and its transpose, so EXIF orientation (applied or not) does not change it.

The size is read from the image's header (``imagesize``: PNG, JPEG, GIF, WebP, ...) for a ``data:``
URL; an image given by address (``https://``, ``file:``), whose bytes only the engine fetches, has
no size here, so its count is unknown.
"""

from __future__ import annotations

import binascii
import io
import math
from dataclasses import dataclass

import imagesize

MAX_RATIO = 200
"""transformers' ``smart_resize`` refuses images more elongated than this (vLLM then fails them)."""

_HEADS = (8_192, 131_072)
"""Base64 characters decoded first (6 KiB: any PNG, GIF or WebP header, most JPEGs'), then 96 KiB
(past a JPEG's large EXIF segment), then all: decoding costs about 3 µs a KiB here."""


@dataclass(frozen=True, slots=True)
class VisionGrid:
    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 3_136
    max_pixels: int = 12_845_056

    def tokens(self, width: int, height: int) -> int | None:
        """Placeholder tokens of one ``width × height`` image (None: one the engine refuses)."""
        if width < 1 or height < 1 or max(width, height) / min(width, height) > MAX_RATIO:
            return None
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
        return (h_bar // self.patch_size) * (w_bar // self.patch_size) // (self.merge_size ** 2)


def data_url_image_size(url: str) -> tuple[int, int] | None:
    """``(width, height)`` of a base64 ``data:`` URL's image from its header; None for any other
    address, data that is not base64, or a format whose header gives no size."""
    if not url.startswith("data:"):
        return None
    meta, comma, payload = url.partition(",")
    if not comma or not meta.endswith(";base64"):
        return None
    for limit in (*(n for n in _HEADS if n < len(payload)), len(payload)):
        chunk = payload[:limit - limit % 4] if limit < len(payload) else payload
        try:
            data = binascii.a2b_base64(chunk.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError):
            return None
        width, height = imagesize.get(io.BytesIO(data), exif_rotation=False)
        if width > 0 and height > 0:
            return width, height
    return None
