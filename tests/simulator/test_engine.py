"""Acceptance tests of the simulated engine, in virtual time (no sockets, no sleeping)."""

from __future__ import annotations

from typing import TypeVar

import pytest

from kvgate.simulator.engine import Engine, EngineEvent, Finished, FirstToken, SimRequest, TokenOut
from kvgate.simulator.tokenizer import encode
from kvgate.simulator.virtual_time import Arrival, run_virtual
from tests.simulator.test_engine_support import formula, make_engine, prompt, request

E = TypeVar("E", FirstToken, Finished)


def _drain(
    engine: Engine, now: float, durations: list[float] | None = None
) -> tuple[float, list[EngineEvent]]:
    """Step the engine until idle; returns the end time and the events (and appends step durations)."""
    events: list[EngineEvent] = []
    while (duration := engine.begin_step(now)) is not None:
        if durations is not None:
            durations.append(duration)
        now += duration
        events.extend(engine.end_step(now))
    return now, events


def _only(events: list[EngineEvent], kind: type[E], rid: str) -> E:
    found = [e for e in events if isinstance(e, kind) and e.request_id == rid]
    assert len(found) == 1
    return found[0]


def test_same_2048_token_prompt_twice_prefills_only_the_uncached_remainder() -> None:
    engine = make_engine()
    text_prompt = tuple(encode("".join(f"{i:08d}" for i in range(1024))))  # 8,192 characters
    assert len(text_prompt) == 2048
    block = engine.config.block_size
    expected_cached = (2048 - 1) // block * block  # vLLM recomputes the last token: 127 blocks
    assert expected_cached == 2032

    engine.submit(SimRequest("a", text_prompt, 4), 0.0)
    steps: list[float] = []
    now, events = _drain(engine, 0.0, steps)
    first = _only(events, Finished, "a")
    assert first.cached_tokens == 0
    assert steps[0] == formula(2048, 0)  # the first token comes out of one full prefill step
    assert first.ttft == steps[0]
    before = engine.metrics()
    assert (before.prefix_cache_queries, before.prefix_cache_hits) == (2048, 0)

    engine.submit(SimRequest("b", text_prompt, 4), now)
    steps.clear()
    _, events = _drain(engine, now, steps)
    second = _only(events, Finished, "b")
    assert second.cached_tokens == expected_cached
    assert _only(events, FirstToken, "b").cached_tokens == expected_cached
    assert steps[0] == formula(2048 - expected_cached, 0)  # prefill part: the 16 uncached tokens only
    assert second.ttft == pytest.approx(steps[0], rel=1e-12)  # (now + d) - now, in floating point
    after = engine.metrics()
    assert after.prefix_cache_hits - before.prefix_cache_hits == expected_cached
    assert after.prefix_cache_queries - before.prefix_cache_queries == 2048
    assert after.prompt_tokens_total == 2 * 2048


def test_prefix_cache_is_seeded_by_adapter() -> None:
    engine = make_engine(served_loras=("ad",), lora_load_time=0.0)
    engine.submit(request("base", 512, 1), 0.0)
    now, _ = _drain(engine, 0.0)
    engine.submit(request("lora", 512, 1, lora="ad"), now)
    now, events = _drain(engine, now)
    assert _only(events, Finished, "lora").cached_tokens == 0
    engine.submit(request("lora2", 512, 1, lora="ad"), now)
    _, events = _drain(engine, now)
    assert _only(events, Finished, "lora2").cached_tokens == 511 // 16 * 16


def test_kv_exhaustion_makes_requests_wait_and_loses_none() -> None:
    engine = make_engine(num_gpu_blocks=64, block_size=16)  # 1,024 token slots
    arrivals = [Arrival(0.0, request(f"r{i}", 300, 40, salt=i)) for i in range(10)]  # 22 blocks each
    run = run_virtual(engine, arrivals, record_metrics=True)
    waiting_seen = [s.metrics.waiting for s in run.steps if s.metrics is not None]
    assert max(waiting_seen) > 0
    assert max(s.metrics.kv_cache_usage for s in run.steps if s.metrics is not None) <= 1.0
    assert sorted(run.finished) == sorted(f"r{i}" for i in range(10))
    assert all(f.completion_tokens == 40 for f in run.finished.values())
    end = engine.metrics()
    assert (end.waiting, end.running, end.request_success_total) == (0, 0, 10)
    assert engine.kv_cache.num_free == 64


def test_running_out_of_blocks_preempts_the_newest_and_still_finishes_everyone() -> None:
    engine = make_engine(num_gpu_blocks=64, block_size=16)
    # 200-token prompts (13 blocks) are all admitted; growing to 499 tokens (32 blocks) each cannot last
    arrivals = [Arrival(0.0, request(f"r{i}", 200, 300, salt=i)) for i in range(4)]
    run = run_virtual(engine, arrivals, record_metrics=True)
    preempted = [rid for s in run.steps for rid in s.plan.preempted]
    assert preempted, "the workload must trigger preemption"
    assert engine.metrics().preemptions_total == len(preempted)
    assert preempted[0] == "r3"  # the newest running request goes first
    assert sorted(run.finished) == ["r0", "r1", "r2", "r3"]
    for rid in run.finished:
        indexes = [e.index for e in run.events if isinstance(e, TokenOut) and e.request_id == rid]
        assert indexes == list(range(300))  # every token once, in order, none lost to preemption
    assert any(s.metrics is not None and s.metrics.waiting > 0 for s in run.steps)
    assert engine.kv_cache.num_free == 64


def test_adapter_beyond_max_loras_waits_for_a_free_slot_and_loading_costs_time() -> None:
    engine = make_engine(served_loras=("a", "b"), max_loras=1, lora_load_time=0.025)
    arrivals = [Arrival(0.0, request("ra", 100, 5, salt=1, lora="a")),
                Arrival(0.0, request("rb", 100, 5, salt=2, lora="b")),
                Arrival(0.0, request("base", 100, 5, salt=3))]
    run = run_virtual(engine, arrivals, record_metrics=True)
    first = run.steps[0]
    assert first.metrics is not None
    assert first.metrics.running_loras == ("a",)
    assert first.metrics.waiting_loras == ("b",)
    assert first.metrics.running == 2  # the base-model request passes the blocked adapter request
    assert first.plan.lora_loads == ("a",)
    assert first.plan.duration == formula(200, 0) + 0.025
    first_b = next(e for e in run.events if isinstance(e, FirstToken) and e.request_id == "rb")
    assert first_b.time > run.finished["ra"].time
    loads = [s for s in run.steps if s.plan.lora_loads]
    assert [s.plan.lora_loads for s in loads] == [("a",), ("b",)]
    assert loads[1].plan.duration == formula(100, 0) + 0.025  # b alone: the others are done


def test_resident_adapter_is_not_reloaded() -> None:
    engine = make_engine(served_loras=("a",), max_loras=1)
    engine.submit(request("r1", 64, 1, lora="a"), 0.0)
    now, _ = _drain(engine, 0.0)
    engine.submit(request("r2", 64, 1, salt=5, lora="a"), now)
    duration = engine.begin_step(now)
    assert duration == formula(64, 0)
    assert engine.last_step is not None
    assert engine.last_step.lora_loads == ()


@pytest.mark.parametrize("slowdown", [1.0, 2.5])
def test_step_times_match_the_formula_exactly(slowdown: float) -> None:
    engine = make_engine(slowdown=slowdown)
    arrivals = [Arrival(0.0, request("a", 100, 3, salt=1)), Arrival(0.001, request("b", 300, 2, salt=2))]
    run = run_virtual(engine, arrivals)
    plans = [(s.plan.prefill_tokens, s.plan.decode_tokens, s.plan.duration) for s in run.steps]
    # b arrives during a's prefill and joins the next step; a decodes meanwhile
    assert plans == [
        (100, 0, formula(100, 0) * slowdown),
        (300, 1, formula(300, 1) * slowdown),
        (0, 2, formula(0, 2) * slowdown),
    ]
    assert run.finished["a"].ttft == formula(100, 0) * slowdown
    assert run.steps[1].start == formula(100, 0) * slowdown


def test_chunked_prefill_respects_the_token_budget_and_batch_the_seq_limit() -> None:
    engine = make_engine(max_num_batched_tokens=512, max_num_seqs=4)
    arrivals = [Arrival(0.0, request("long", 2000, 3, salt=99))]
    arrivals += [Arrival(0.0005 * i, request(f"r{i}", 150 + 37 * i, 6, salt=i)) for i in range(12)]
    run = run_virtual(engine, arrivals, record_metrics=True)
    assert len(run.finished) == 13
    for step in run.steps:
        assert step.plan.prefill_tokens + step.plan.decode_tokens <= 512
        assert step.plan.batch_size <= 4
        assert step.metrics is not None
        assert step.metrics.running <= 4
    long_steps = run.steps[:4]
    # long's chunks are 512, 512, 512, 464; the last step's 48 spare tokens start r0's prefill
    assert [s.plan.prefill_tokens for s in long_steps] == [512, 512, 512, 512]
    assert [s.plan.batch_size for s in long_steps] == [1, 1, 1, 2]
    assert run.finished["long"].ttft == sum(s.plan.duration for s in long_steps)


def test_peek_changes_no_state() -> None:
    def play(with_peeks: bool) -> list[tuple[object, ...]]:
        engine = make_engine(num_gpu_blocks=80, max_num_batched_tokens=256)
        shared = prompt(400, salt=7)
        reqs = [SimRequest(f"r{i}", shared[: 200 + 20 * i] + prompt(30, salt=i), 20) for i in range(8)]
        trace: list[tuple[object, ...]] = []
        now = 0.0
        for i, req in enumerate(reqs):
            if with_peeks:
                for r in reqs:
                    engine.peek(r.prompt_tokens, None, now)
            engine.submit(req, now)
            for _ in range(3 + i):
                duration = engine.begin_step(now)
                if duration is None:
                    break
                if with_peeks:
                    peeked = engine.peek(shared, None, now)
                    trace.append(("peek", peeked.waiting, peeked.running))
                now += duration
                trace.append((engine.last_step, engine.metrics(), tuple(engine.end_step(now))))
        while (duration := engine.begin_step(now)) is not None:
            now += duration
            trace.append((engine.last_step, engine.metrics(), tuple(engine.end_step(now))))
        return [t for t in trace if t[0] != "peek"]

    assert play(with_peeks=True) == play(with_peeks=False)


def test_peek_reports_the_prefix_a_submission_would_hit() -> None:
    engine = make_engine()
    engine.submit(request("a", 1000, 1, salt=3), 0.0)
    now, _ = _drain(engine, 0.0)
    longer = prompt(1000, salt=3) + prompt(100, salt=4)
    peeked = engine.peek(longer, None, now)
    assert peeked.cached_tokens == 1000 // 16 * 16
    assert (peeked.waiting, peeked.running) == (0, 0)
    assert peeked.estimated_wait == formula(1100 - peeked.cached_tokens, 0)
    engine.submit(SimRequest("b", longer, 1), now)
    _, events = _drain(engine, now)
    assert _only(events, Finished, "b").cached_tokens == peeked.cached_tokens


def test_abort_frees_blocks_and_emits_nothing_more() -> None:
    engine = make_engine()
    engine.submit(request("a", 100, 50), 0.0)
    engine.submit(request("w", 100, 5, salt=1), 0.0)
    duration = engine.begin_step(0.0)
    assert duration is not None
    engine.abort("a", 0.001)  # mid-step
    events = engine.end_step(duration)
    assert all(e.request_id != "a" for e in events)
    _, rest = _drain(engine, duration)
    assert all(e.request_id != "a" for e in rest)
    m = engine.metrics()
    assert (m.requests_aborted_total, m.request_success_total, m.running, m.waiting) == (1, 1, 0, 0)
    assert engine.kv_cache.num_free == engine.config.num_gpu_blocks
    engine.abort("a", 1.0)  # unknown now: ignored


def test_abort_while_waiting() -> None:
    engine = make_engine(max_num_seqs=1)
    engine.submit(request("a", 10, 3), 0.0)
    engine.submit(request("b", 10, 3, salt=1), 0.0)
    engine.abort("b", 0.0)
    assert engine.metrics().waiting == 1  # a
    _, events = _drain(engine, 0.0)
    assert {e.request_id for e in events} == {"a"}
    assert not engine.has_work()


def test_submissions_during_a_step_join_the_next_one() -> None:
    engine = make_engine()
    engine.submit(request("a", 100, 2), 0.0)
    duration = engine.begin_step(0.0)
    assert duration is not None
    assert engine.in_step
    engine.submit(request("b", 100, 2, salt=1), duration / 2)
    events = engine.end_step(duration)
    assert {e.request_id for e in events} == {"a"}
    assert engine.begin_step(duration) == formula(100, 1)


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (SimRequest("e", (), 5), "empty"),
        (SimRequest("m", (1, 2), 0), "max_tokens"),
        (SimRequest("l", (1, 2), 1, "nope"), "not loaded"),
        (SimRequest("big", prompt(1000), 100), "KV blocks"),
    ],
)
def test_submit_rejects_requests_that_can_never_run(req: SimRequest, message: str) -> None:
    engine = make_engine(num_gpu_blocks=64)
    with pytest.raises(ValueError, match=message):
        engine.submit(req, 0.0)
    assert not engine.has_work()


def test_duplicate_request_id_is_rejected_and_lora_registry_changes() -> None:
    engine = make_engine()
    engine.submit(request("a", 10, 1), 0.0)
    with pytest.raises(ValueError, match="in flight"):
        engine.submit(request("a", 10, 1), 0.0)
    engine.load_lora("new")
    assert engine.metrics().served_loras == ("new",)
    engine.submit(request("n", 10, 1, lora="new"), 0.0)
    engine.unload_lora("new")
    _, events = _drain(engine, 0.0)
    assert {e.request_id for e in events if isinstance(e, Finished)} == {"a", "n"}
    with pytest.raises(ValueError, match="not loaded"):
        engine.submit(request("n2", 10, 1, lora="new"), 1.0)


def test_begin_and_end_must_alternate() -> None:
    engine = make_engine()
    assert engine.begin_step(0.0) is None
    with pytest.raises(RuntimeError):
        engine.end_step(0.0)
    engine.submit(request("a", 10, 1), 0.0)
    assert engine.begin_step(0.0) is not None
    with pytest.raises(RuntimeError):
        engine.begin_step(0.0)
