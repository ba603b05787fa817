"""Which ``model`` names the gateway accepts from a client.

A request's model name travels on: into a header that routes match on (``x-gateway-model-name``),
into the outcome header Envoy logs, and into the label of every per-request metric. Names of real
models and adapters are short and plain (Hugging Face ids ``org/name-v1.5``, vLLM's
``--served-model-name`` and LoRA names, local paths ``/models/llama-3.1-8b``, OpenAI's
``ft:gpt-4o:org:tag``), so the gateway answers anything else 400 ``invalid_model_name`` before it
reaches a header, a label or a replica: control characters (a NUL or CR broke the metrics page; a
newline broke the header mutation, which Envoy answered 503), whitespace, quotes and 100 KB names.

Accepted: 1 to :data:`MAX_MODEL_NAME_CHARS` characters, each a letter or digit (any script), or one
of ``_ . - : / @ + = ~`` (:data:`ALLOWED_PUNCTUATION`).
"""

from __future__ import annotations

import re

from kvgate.policies.errors import InvalidModelNameError

MAX_MODEL_NAME_CHARS = 256
ALLOWED_PUNCTUATION = "_.-:/@+=~"
_NAME = re.compile(r"[\w.:/@+=~-]+")


def check_model_name(model: str) -> None:
    """Raise :class:`InvalidModelNameError` (400) unless ``model`` is a name the gateway accepts."""
    if len(model) > MAX_MODEL_NAME_CHARS:
        raise InvalidModelNameError(
            f"'model' is {len(model)} characters long; the gateway accepts at most {MAX_MODEL_NAME_CHARS}"
        )
    if _NAME.fullmatch(model) is None:
        raise InvalidModelNameError(
            f"'model' may contain only letters, digits and {' '.join(ALLOWED_PUNCTUATION)}"
        )
