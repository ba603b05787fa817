"""One replica's side of disaggregated serving: holding a finished prefill's blocks for a decode
instance, and reading a remote prefill's blocks before decoding (``simulator.kv_transfer`` has the
protocol and the transfer-time model)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from kvgate.simulator.engine import Engine, Finished
from kvgate.simulator.kv_transfer import (
    KvTransferHub,
    KvTransferSettings,
    RemotePrefill,
    prefill_response_params,
)
from kvgate.simulator.metrics import ReplicaMetrics


class KvTransferAgent:
    """Holds, expires and reads KV blocks for one replica; counts what it did."""

    def __init__(self, engine: Engine, metrics: ReplicaMetrics, settings: KvTransferSettings,
                 time_scale: float, hub: KvTransferHub, index: int) -> None:
        self.engine_id = f"kvgate-sim-{uuid.uuid4().hex[:12]}-{index}"
        """This replica's NIXL engine id (``remote_engine_id`` in its prefills' answers)."""
        self._engine = engine
        self._metrics = metrics
        self._settings = settings
        self._time_scale = time_scale
        self._hub = hub
        hub.register_engine(self.engine_id)
        self._expiries: set[asyncio.TimerHandle] = set()
        self.receiving = 0
        """Requests waiting for their remote KV (vLLM: ``WAITING_FOR_REMOTE_KVS``, counted as waiting)."""
        self.remote_prefills = 0  # prefills served for a remote decode (do_remote_decode)
        self.remote_decodes = 0  # requests decoded from a remote prefill's KV (do_remote_prefill)
        self.transfers_failed = 0  # the remote KV was no longer held: the prompt was computed here
        self.expired = 0  # held prefill KV that no decode read in time

    def close(self) -> None:
        for handle in self._expiries:
            handle.cancel()
        self._expiries.clear()

    def hold_for_decode(
        self, request_id: str, finished: Finished, address: tuple[str, int]
    ) -> dict[str, Any]:
        """A finished prefill for a remote decode: its blocks wait to be read, or expire. Returns the
        ``kv_transfer_params`` of its answer."""
        self.remote_prefills += 1
        if finished.held_blocks:
            engine = self._engine
            self._hub.hold(self.engine_id, request_id, lambda: engine.release_held(request_id))
            delay = self._settings.hold_timeout_s * self._time_scale
            handle: asyncio.TimerHandle

            def expire() -> None:
                self._expire(request_id, handle)

            handle = asyncio.get_running_loop().call_later(delay, expire)
            self._expiries.add(handle)
        host, port = address
        return prefill_response_params(block_ids=finished.held_blocks, engine_id=self.engine_id,
                                       request_id=request_id, host=host, port=port)

    def _expire(self, request_id: str, handle: asyncio.TimerHandle) -> None:
        self._expiries.discard(handle)
        if self._hub.expire(self.engine_id, request_id):
            self.expired += 1
            self._metrics.kv_expired()

    async def receive(self, transfer: RemotePrefill) -> int:
        """Read a remote prefill's blocks, taking the transfer's time; the prompt tokens received, 0
        when the prefill no longer holds them (the prompt is then computed here)."""
        block_size = self._engine.config.block_size
        blocks = len(transfer.block_ids)
        seconds = self._settings.transfer_time(blocks, block_size)
        self.receiving += 1
        try:
            await asyncio.sleep(seconds * self._time_scale)
        finally:
            self.receiving -= 1
        self.remote_decodes += 1
        if self._hub.read(transfer.engine_id, transfer.request_id) == "missing":
            self.transfers_failed += 1
            self._metrics.kv_transfer_failed()
            return 0
        if blocks:
            self._metrics.kv_transferred(seconds, self._settings.bytes_of(blocks, block_size))
        return blocks * block_size

    def stats(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "remote_prefills": self.remote_prefills,
            "remote_decodes": self.remote_decodes,
            "kv_transfers_failed": self.transfers_failed,
            "kv_expired": self.expired,
            "kv_held": self._engine.held_requests,
            "kv_receiving": self.receiving,
        }
