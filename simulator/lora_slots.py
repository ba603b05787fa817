"""LoRA adapters of one simulated replica: the registry and the GPU slots (vLLM semantics).

- The *registry* is the set of adapters the replica can serve (``--loras``, or vLLM's
  ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``). A request for an adapter outside it is
  refused when submitted.
- ``max_loras`` GPU slots bound how many *different* adapters the running batch may use. The engine
  admits a waiting request for adapter A only if A is already used by a running request or fewer than
  ``max_loras`` adapters are in use; otherwise the request waits (other waiting requests may pass it,
  as in vLLM). A slot is free when no running request uses its adapter.
- Slots keep their adapter after its requests finish (LRU): running A again later costs nothing.
  A step that needs an adapter that is not resident loads it into the least recently used slot whose
  adapter no running request uses, and the step takes ``lora_load_time`` longer per adapter loaded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable


class LoraSlots:
    """Adapter registry plus the LRU set of adapters resident in GPU slots."""

    def __init__(self, max_loras: int, served: Iterable[str] = ()) -> None:
        if max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        self.max_loras = max_loras
        self._served: set[str] = set(served)
        self._resident: OrderedDict[str, None] = OrderedDict()

    # ---- registry ------------------------------------------------------------------------------
    def register(self, name: str) -> None:
        """Make ``name`` servable (idempotent)."""
        self._served.add(name)

    def unregister(self, name: str, in_use: Collection[str]) -> None:
        """Stop serving ``name`` (new requests are refused); frees its slot unless a request runs it."""
        self._served.discard(name)
        if name not in in_use:
            self._resident.pop(name, None)

    def is_served(self, name: str) -> bool:
        return name in self._served

    @property
    def served(self) -> tuple[str, ...]:
        return tuple(sorted(self._served))

    # ---- GPU slots -----------------------------------------------------------------------------
    def is_resident(self, name: str) -> bool:
        return name in self._resident

    @property
    def resident(self) -> tuple[str, ...]:
        """Resident adapters, least recently used first."""
        return tuple(self._resident)

    def ensure_resident(self, needed: Iterable[str], in_use: Collection[str]) -> tuple[str, ...]:
        """Load every adapter of ``needed`` that is not resident; returns those loaded.

        ``in_use`` are the adapters of running requests (never evicted); the engine guarantees there
        are at most ``max_loras`` of them and that ``needed`` is a subset.
        """
        loaded: list[str] = []
        resident = self._resident
        for name in needed:
            if name in resident:
                resident.move_to_end(name)
                continue
            if len(resident) >= self.max_loras:
                victim = next((r for r in resident if r not in in_use), None)
                if victim is None:
                    raise RuntimeError("no free LoRA slot: more adapters in use than max_loras")
                del resident[victim]
            resident[name] = None
            loaded.append(name)
        return tuple(loaded)
