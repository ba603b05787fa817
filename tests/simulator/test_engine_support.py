"""Shared helpers for the engine tests (virtual time only; this module holds no tests)."""

from __future__ import annotations

from kvgate.simulator.engine import Engine, EngineConfig, SimRequest
from kvgate.simulator.profiles import load_profile

BASE_US = 5752.7
PREFILL_US = 17.25
DECODE_US = 6.00


def formula(prefill: int, decode: int) -> float:
    """The published step-time fit, in seconds, written out independently of the profile file."""
    return (BASE_US + PREFILL_US * prefill + DECODE_US * decode) / 1_000_000


def make_engine(**overrides: object) -> Engine:
    config = EngineConfig(**overrides)  # type: ignore[arg-type]
    return Engine(config, load_profile("blis-llama-3.1-8b-h100"))


def prompt(n: int, salt: int = 0) -> tuple[int, ...]:
    """``n`` token ids; different salts give prompts that share no block."""
    return tuple((salt * 1_000_003 + i * 7919) % 128256 for i in range(n))


def request(rid: str, n: int, max_tokens: int, salt: int = 0, lora: str | None = None) -> SimRequest:
    return SimRequest(rid, prompt(n, salt), max_tokens, lora)
