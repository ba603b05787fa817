"""The KV-event source an EndpointPickerConfig's precise prefix plugin names (llm-d's
``precise-prefix-cache-scorer`` / ``-producer``: ``policies.epp_config``), as the default
``kvEvents`` of the picker's pools, with the model's tokenizer found on the picker's disk where the
config's ``tokenizersPoolConfig`` says (llm-d's ``local`` settings: a map from model to
``tokenizer.json``, else a directory searched as llm-d searches it; kvgate never downloads one).

A pool that names its own KV events keeps them (given the config's tokenizer if it names none).
"""

from __future__ import annotations

import logging
from pathlib import Path

from kvgate.gateway.picker.pools_file import KvEventsSpec, PoolSpec
from kvgate.policies.epp_config import TokenizerHint, Translation

log = logging.getLogger(__name__)

DEFAULT_TOKENIZER_DIR = "/mnt/models"
"""llm-d's ``local.autoDiscoveryDir`` default: where model servers' volumes are mounted."""


def find_tokenizer(hint: TokenizerHint) -> str | None:
    """The ``tokenizer.json`` the hint names (its model's entry in ``files``), else one under its
    directory: ``<dir>/<model>/<file>``, Hugging Face's cache layout
    ``<dir>/models--<org>--<name>/snapshots/*/<file>``, or ``<dir>/<file>`` (a directory of one
    model); None where none is a file."""
    if hint.model is not None and hint.model in hint.files:
        named = Path(hint.files[hint.model]).expanduser()
        return str(named) if named.is_file() else None
    root = Path(hint.directory or DEFAULT_TOKENIZER_DIR).expanduser()
    candidates: list[Path] = []
    if hint.model is not None:
        candidates.append(root / hint.model / hint.file_name)
        cache = root / f"models--{hint.model.replace('/', '--')}" / "snapshots"
        if cache.is_dir():
            candidates.extend(sorted(cache.glob(f"*/{hint.file_name}")))
    candidates.append(root / hint.file_name)
    return next((str(path) for path in candidates if path.is_file()), None)


def kv_events_default(translation: Translation | None) -> KvEventsSpec | None:
    """The pools' default ``kvEvents`` from the config's precise plugin (None: it names none)."""
    if translation is None or translation.kv_events is None:
        return None
    source = translation.kv_events
    tokenizer = find_tokenizer(translation.tokenizer) if translation.tokenizer is not None else None
    if tokenizer is None:
        where = translation.tokenizer
        log.warning("EndpointPickerConfig: the precise prefix plugin's tokenizer%s was not found on this "
                    "disk (%s): give the pool kvgate.io/tokenizer (a pools file: kvEvents.tokenizer), the "
                    "model's tokenizer files mounted in the picker's pod; until then the engines' events "
                    "are followed but routing keeps the approximate index",
                    f" ({where.model})" if where is not None and where.model else "",
                    (where.directory if where is not None and where.directory else DEFAULT_TOKENIZER_DIR))
    spec = KvEventsSpec(port=source.port, bind=source.bind, tokenizer=tokenizer)
    source_text = (f"each endpoint's port {spec.port}" if spec.port is not None
                   else f"the engines connecting to {spec.bind}")
    log.info("EndpointPickerConfig: the pools' KV events from %s%s", source_text,
             f", tokenized with {tokenizer}" if tokenizer else "")
    return spec


def with_kv_events_default(pool: PoolSpec, default: KvEventsSpec | None) -> PoolSpec:
    """``pool`` with ``default`` where it names no KV events, or the default's tokenizer where its
    own KV events name none."""
    if default is None:
        return pool
    own = pool.kv_events
    if own is None:
        return pool.model_copy(update={"kv_events": default})
    if own.tokenizer is None and default.tokenizer is not None:
        return pool.model_copy(update={"kv_events": own.model_copy(update={"tokenizer": default.tokenizer})})
    return pool
