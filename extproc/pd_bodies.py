"""The bodies of a disaggregated request's two halves, in vLLM's NixlConnector protocol (pure).

vLLM's proxy (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``) and llm-d's routing
sidecar speak it the same way:

- **prefill**: the client's body with ``kv_transfer_params`` asking for a remote decode,
  ``stream: false``, ``max_tokens: 1`` (and ``max_completion_tokens: 1`` when the body has it),
  without ``stream_options``, ``min_tokens`` and ``min_completion_tokens`` (not supported on the
  prefill side);
- **decode**: the client's body with the ``kv_transfer_params`` the prefill's answer carried.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ASK_FOR_REMOTE_DECODE: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_NOT_ON_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens")


class PrefillAnswerError(ValueError):
    """The prefill endpoint's answer carries no usable ``kv_transfer_params``."""


def _object(body: bytes) -> dict[str, Any]:
    value = json.loads(body)
    if not isinstance(value, dict):
        raise ValueError("the body is not a JSON object")
    return value


def _dump(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def prefill_body(body: bytes) -> bytes:
    """The prefill half's body (``body``: what the decode side would get, rewrites applied)."""
    data = _object(body)
    for key in _NOT_ON_PREFILL:
        data.pop(key, None)
    data["kv_transfer_params"] = dict(ASK_FOR_REMOTE_DECODE)
    data["stream"] = False
    data["max_tokens"] = 1
    if "max_completion_tokens" in data:
        data["max_completion_tokens"] = 1
    return _dump(data)


def transfer_params(answer: bytes) -> dict[str, Any]:
    """The ``kv_transfer_params`` of a prefill's (non-streamed) answer; PrefillAnswerError when it has
    none (the endpoint is not a NixlConnector prefill instance) or the answer is not JSON."""
    try:
        params = _object(answer).get("kv_transfer_params")
    except ValueError as exc:
        raise PrefillAnswerError(f"the prefill answer is not a JSON object: {exc}") from exc
    if not isinstance(params, dict) or not params:
        raise PrefillAnswerError("the prefill answer has no kv_transfer_params")
    return params


def decode_body(body: bytes, params: Mapping[str, Any]) -> bytes:
    """The decode half's body: ``body`` with the prefill's ``kv_transfer_params``."""
    data = _object(body)
    data["kv_transfer_params"] = dict(params)
    return _dump(data)
