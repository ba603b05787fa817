"""The engine's two halves of disaggregated serving (vLLM's NixlConnector semantics), in virtual time:
a prefill that holds its prompt blocks for a remote decode, and a decode that admits received blocks
as computed."""

from __future__ import annotations

from kvgate.simulator.engine import Engine, EngineEvent, Finished, FirstToken, SimRequest
from tests.simulator.test_engine_support import formula, make_engine, prompt


def _drain(engine: Engine, now: float, steps: list[float]) -> tuple[float, list[EngineEvent]]:
    events: list[EngineEvent] = []
    while (duration := engine.begin_step(now)) is not None:
        steps.append(duration)
        now += duration
        events.extend(engine.end_step(now))
    return now, events


def _finished(events: list[EngineEvent], rid: str) -> Finished:
    (found,) = [e for e in events if isinstance(e, Finished) and e.request_id == rid]
    return found


def test_a_prefill_for_a_remote_decode_holds_its_full_prompt_blocks_until_released() -> None:
    engine = make_engine(num_gpu_blocks=100)
    engine.submit(SimRequest("p", prompt(1000), 1, hold_kv=True), 0.0)
    _, events = _drain(engine, 0.0, [])
    done = _finished(events, "p")
    assert len(done.held_blocks) == 1000 // 16  # 62 full blocks; the partial 63rd is not sent
    assert engine.held_requests == 1
    assert engine.kv_cache.num_free == 100 - 62  # held, not freed
    assert engine.release_held("p") is True
    assert engine.release_held("p") is False
    assert engine.kv_cache.num_free == 100
    assert engine.held_requests == 0


def test_a_prefill_without_hold_frees_its_blocks_at_once() -> None:
    engine = make_engine(num_gpu_blocks=100)
    engine.submit(SimRequest("p", prompt(1000), 1), 0.0)
    _, events = _drain(engine, 0.0, [])
    assert _finished(events, "p").held_blocks == ()
    assert engine.kv_cache.num_free == 100


def test_a_decode_with_received_blocks_computes_only_the_rest_of_the_prompt() -> None:
    engine = make_engine()
    steps: list[float] = []
    engine.submit(SimRequest("d", prompt(4000), 3, remote_tokens=3984), 0.0)  # 249 whole blocks
    _, events = _drain(engine, 0.0, steps)
    assert steps[0] == formula(4000 - 3984, 0)  # the first step prefills 16 tokens, not 4,000
    first = next(e for e in events if isinstance(e, FirstToken))
    assert first.cached_tokens == 3984  # vLLM counts received tokens as computed (usage.cached_tokens)
    done = _finished(events, "d")
    assert done.remote_tokens == 3984
    m = engine.metrics()
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (4000, 0)  # not a local cache hit


def test_received_blocks_never_cover_the_last_prompt_token() -> None:
    engine = make_engine()
    steps: list[float] = []
    engine.submit(SimRequest("d", prompt(64), 1, remote_tokens=64), 0.0)
    _drain(engine, 0.0, steps)
    assert steps[0] == formula(16, 0)  # 3 blocks received, the last block's 16 tokens recomputed


def test_received_blocks_register_in_the_prefix_cache_for_later_requests() -> None:
    engine = make_engine()
    engine.submit(SimRequest("d", prompt(320), 1, remote_tokens=320), 0.0)
    now, _ = _drain(engine, 0.0, [])
    steps: list[float] = []
    engine.submit(SimRequest("again", prompt(320), 1), now)
    _, events = _drain(engine, now, steps)
    assert _finished(events, "again").cached_tokens == 304
    assert steps[0] == formula(16, 0)
