"""This picker's in-flight requests per endpoint and target model (base model or LoRA adapter).

A scrape says which adapters a replica had active 50 ms ago; the picker knows which adapters it
has sent where since. The estimated-TTFT scorer treats an adapter this picker has in flight on an
endpoint as resident there (it is loaded or loading: no new slot needed) and counts such adapters
against the endpoint's ``max_loras`` slots, so a burst of a newly popular adapter stays on the
replicas already loading it instead of taking a slot on every replica.

Local to one picker process (not shared through Redis): it bridges the gap to the next scrape,
which every picker reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class InflightModels:
    def __init__(self) -> None:
        self._by_endpoint: dict[str, dict[str, int]] = {}
        self._requests: dict[str, tuple[str, str]] = {}

    def add(self, request_id: str, address: str, model: str) -> None:
        """Count the request on ``address``; a second add for the same id moves it."""
        self.remove(request_id)
        self._requests[request_id] = (address, model)
        models = self._by_endpoint.setdefault(address, {})
        models[model] = models.get(model, 0) + 1

    def remove(self, request_id: str) -> None:
        """Idempotent."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        address, model = entry
        models = self._by_endpoint.get(address)
        if models is None:
            return
        left = models.get(model, 0) - 1
        if left > 0:
            models[model] = left
        else:
            models.pop(model, None)
            if not models:
                del self._by_endpoint[address]

    @property
    def requests(self) -> int:
        """Requests in flight, all endpoints."""
        return len(self._requests)

    def forget_endpoint(self, address: str) -> None:
        self._by_endpoint.pop(address, None)
        for request_id in [r for r, (a, _m) in self._requests.items() if a == address]:
            del self._requests[request_id]

    def by_endpoint(self) -> Mapping[str, Mapping[str, int]]:
        """Address → {model: requests in flight}; a live read-only view (absent = none)."""
        return MappingProxyType(self._by_endpoint)
