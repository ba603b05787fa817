"""Blocks an endpoint will hold but has not reported yet: the keys of the requests kvgate sent it,
from the pick until the request ends (issue 37; sans-IO).

An engine reports a prompt's blocks when its prefill has computed them, tens of milliseconds to
seconds after the pick; a request for the same prefix picked in between would see no endpoint
holding it and spread the prefix over the fleet. So the requests in flight count as holding their
keys (llm-d's precise scorer keeps such speculative entries for a while; Dynamo's router its active
blocks). By the time a request ends its blocks were reported (or evicted, which its events say).
Bounded: the oldest requests are dropped first past ``max_requests``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence


class PendingBlocks:
    def __init__(self, max_requests: int = 4096) -> None:
        self.max_requests = max_requests
        self._requests: OrderedDict[str, tuple[str, Sequence[int]]] = OrderedDict()
        """Request id → (endpoint, its block keys)."""
        self._holders: dict[int, dict[str, int]] = {}
        """Key → endpoint → how many requests in flight there carry it."""

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, request_id: str, endpoint: str, keys: Sequence[int]) -> None:
        self.remove(request_id)
        if not keys:
            return
        self._requests[request_id] = (endpoint, keys)
        holders = self._holders
        for key in keys:
            counts = holders.get(key)
            if counts is None:
                holders[key] = {endpoint: 1}
            else:
                counts[endpoint] = counts.get(endpoint, 0) + 1
        while len(self._requests) > self.max_requests:
            oldest = next(iter(self._requests))
            self.remove(oldest)

    def move(self, request_id: str, endpoint: str) -> None:
        """Another endpoint serves the request (a fallback)."""
        entry = self._requests.get(request_id)
        if entry is not None and entry[0] != endpoint:
            self.add(request_id, endpoint, entry[1])

    def remove(self, request_id: str) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        endpoint, keys = entry
        holders = self._holders
        for key in keys:
            counts = holders.get(key)
            if counts is None:
                continue
            left = counts.get(endpoint, 0) - 1
            if left > 0:
                counts[endpoint] = left
            else:
                counts.pop(endpoint, None)
                if not counts:
                    del holders[key]

    def forget_endpoint(self, endpoint: str) -> None:
        for request_id in [r for r, (e, _) in self._requests.items() if e == endpoint]:
            self.remove(request_id)

    def holds(self, key: int) -> bool:
        return key in self._holders

    def matches(self, keys: Sequence[int]) -> Mapping[str, int]:
        """Leading blocks of ``keys`` each endpoint will hold (endpoints with none left out)."""
        holders = self._holders
        if not holders or not keys:
            return {}
        first = holders.get(keys[0])
        if not first:
            return {}
        counts: dict[str, int] = {}
        alive = set(first)
        depth = 1
        for key in keys[1:]:
            here = holders.get(key)
            if here is None:
                break
            if not alive <= here.keys():
                for endpoint in alive - here.keys():
                    counts[endpoint] = depth
                alive &= here.keys()
                if not alive:
                    break
            depth += 1
        for endpoint in alive:
            counts[endpoint] = depth
        return counts
