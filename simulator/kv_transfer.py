"""Disaggregated prefill/decode in the simulator: vLLM's ``kv_transfer_params`` protocol (NixlConnector)
and a model of the KV transfer's time.

The protocol, as vLLM's NixlConnector and its proxy examples speak it
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``):

1. The proxy sends the prefill instance the request with ``max_tokens: 1``, ``stream: false`` and
   ``kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id":
   null, "remote_block_ids": null, "remote_host": null, "remote_port": null}``.
2. The prefill instance computes the prompt, keeps its full blocks (freed once read, or when they
   expire) and answers with ``kv_transfer_params: {"do_remote_prefill": true, "do_remote_decode":
   false, "remote_block_ids": [...], "remote_engine_id": ..., "remote_request_id": ...,
   "remote_host": ..., "remote_port": ..., "tp_size": 1}`` in its (non-streamed) response.
3. The proxy sends the decode instance the original request with those ``kv_transfer_params``; the
   decode instance reads the blocks from the prefill instance, computes the rest of the prompt (at
   least its last token) and generates.

A replica plays either half for any request that asks (vLLM's ``kv_role: kv_both``, what llm-d
deploys); its role (:data:`Role`) only labels it. Transfer time: ``latency + blocks × block_size ×
kv_bytes_per_token / bandwidth``; the defaults and their sources are in docs/simulator.md. Within
one fleet process the decode side tells the prefill side when it has read the blocks
(:class:`KvTransferHub`), as NIXL's notification does; blocks nobody reads expire after
``hold_timeout_s`` (vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvgate.simulator.request_fields import ApiError

Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "both")
LLM_D_ROLE = {"prefill": "prefill", "decode": "decode", "both": "prefill-decode"}
"""The ``llm-d.ai/role`` label value of each role."""


@dataclass(frozen=True)
class KvTransferSettings:
    bandwidth_gbs: float = 40.0
    """Effective GB/s (10^9 bytes) of one KV read: 400 Gb/s RDMA (ConnectX-7) at an assumed 80 % of
    line rate."""
    latency_s: float = 0.002
    """Fixed cost of one transfer (the handshake is cached; descriptor posting and notification)."""
    kv_bytes_per_token: int = 131_072
    """Llama-3.1-8B in bf16: 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 2 bytes."""
    hold_timeout_s: float = 480.0
    """Simulated seconds a prefill keeps unread blocks (vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``)."""

    def __post_init__(self) -> None:
        if self.bandwidth_gbs <= 0 or self.latency_s < 0 or self.kv_bytes_per_token < 1:
            raise ValueError("KV transfer: bandwidth must be > 0, latency >= 0, bytes per token >= 1")
        if self.hold_timeout_s <= 0:
            raise ValueError("KV transfer: the hold timeout must be > 0")

    def bytes_of(self, blocks: int, block_size: int) -> int:
        return blocks * block_size * self.kv_bytes_per_token

    def transfer_time(self, blocks: int, block_size: int) -> float:
        """Simulated seconds to read ``blocks`` KV blocks from a prefill instance."""
        if blocks <= 0:
            return 0.0
        return self.latency_s + self.bytes_of(blocks, block_size) / (self.bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class RemoteDecode:
    """The request is a prefill for a remote decode (``do_remote_decode``)."""


@dataclass(frozen=True)
class RemotePrefill:
    """The request's prompt KV waits on a prefill instance (``do_remote_prefill``)."""

    block_ids: tuple[int, ...]
    engine_id: str
    request_id: str


KvTransfer = RemoteDecode | RemotePrefill


def parse_kv_transfer_params(body: Mapping[str, Any]) -> KvTransfer | None:
    """What a request's ``kv_transfer_params`` ask for; None when absent or asking for nothing.
    Malformed values are a 400, as vLLM's request validation answers."""
    params = body.get("kv_transfer_params")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise ApiError(400, "'kv_transfer_params' must be an object", "kv_transfer_params")
    remote_decode, remote_prefill = params.get("do_remote_decode"), params.get("do_remote_prefill")
    if not isinstance(remote_decode, bool | None) or not isinstance(remote_prefill, bool | None):
        raise ApiError(400, "do_remote_decode and do_remote_prefill must be booleans", "kv_transfer_params")
    if remote_decode and remote_prefill:
        raise ApiError(400, "a request cannot be both a remote prefill and a remote decode",
                       "kv_transfer_params")
    if remote_decode:
        return RemoteDecode()
    if not remote_prefill:
        return None
    blocks = params.get("remote_block_ids")
    if not isinstance(blocks, list) or not all(type(b) is int for b in blocks):
        raise ApiError(400, "remote_block_ids must be a list of block ids", "kv_transfer_params")
    engine_id = params.get("remote_engine_id")
    if not isinstance(engine_id, str):
        raise ApiError(400, "remote_engine_id must be a string", "kv_transfer_params")
    request_id = params.get("remote_request_id")
    return RemotePrefill(tuple(blocks), engine_id, request_id if isinstance(request_id, str) else "")


def prefill_response_params(
    *, block_ids: tuple[int, ...], engine_id: str, request_id: str, host: str, port: int
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a finished prefill answers with (NixlConnector's ``request_finished``)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(block_ids),
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }


ReadOutcome = Literal["read", "missing", "foreign"]


class KvTransferHub:
    """The fleet's held prefills: ``(engine_id, request_id)`` → the call that frees their blocks.

    The decode side ``read``s a prefill's blocks once its transfer is done (NIXL's notification):
    ``"read"`` frees them on the prefill side; ``"missing"`` when an engine of this fleet no longer
    holds them (expired or already read: the decode side then computes the prompt itself, vLLM's
    ``recompute`` policy for failed loads); ``"foreign"`` when the engine is not one of this process
    (a prefill served by another ``kvgate sim``: trusted, its blocks expire there).
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], Callable[[], object]] = {}
        self._engines: set[str] = set()

    def register_engine(self, engine_id: str) -> None:
        self._engines.add(engine_id)

    def hold(self, engine_id: str, request_id: str, release: Callable[[], object]) -> None:
        self._held[(engine_id, request_id)] = release

    def holds(self, engine_id: str, request_id: str) -> bool:
        return (engine_id, request_id) in self._held

    def read(self, engine_id: str, request_id: str) -> ReadOutcome:
        release = self._held.pop((engine_id, request_id), None)
        if release is not None:
            release()
            return "read"
        return "missing" if engine_id in self._engines else "foreign"

    def expire(self, engine_id: str, request_id: str) -> bool:
        """Unread blocks reached their timeout: free them. False when they were read already."""
        release = self._held.pop((engine_id, request_id), None)
        if release is None:
            return False
        release()
        return True
