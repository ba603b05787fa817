"""Replay a routing benchmark's plan through kvgate's scheduler and the simulator's engines, in virtual time.

What ``python -m kvgate.bench.routing`` measures over HTTP in ~2.5 real minutes per run, this plays in
seconds without sockets, Envoy or a clock: the same plan (``bench.workloads.plan``), the same
engines (``simulator.engine.Engine`` with the fleet's settings and latency profile), and kvgate's
``ProfileScheduler`` with the profile under test, fed the way the picker is fed in production:

- every ``--scrape-interval`` simulated seconds (staggered per replica) each replica's gauges become
  its ``EndpointMetrics`` (what the scraper parses from ``/metrics``);
- a request is scheduled and ``on_picked`` at its arrival and submitted to the picked engine at once
  (no network, no picker latency); ``on_first_token`` at its first token; ``on_usage`` (with the
  engine's ``cached_tokens``) and ``on_finished`` when it finishes.

It is a diagnosis and tuning tool, not the benchmark: figures differ from the HTTP runs by the data
path's latency and scrape jitter, and it reports no throughput. ``--explain`` prints, for requests
that leave the replica their prefix was last sent to (a long document, a chat history, a shared
system prompt), every replica's estimated TTFT and the inputs behind it, which is what the HTTP run
cannot show.

Run: ``python -m kvgate.bench.replay --workload long-prompts --fraction 0.9 --requests 600 [--explain 10]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvgate.bench.run_stats import percentile
from kvgate.bench.workloads import WORKLOADS, WorkloadSpec, offered_rate, run_plan
from kvgate.extproc.openai_request import parse_request_body
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.profile import load_profile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import ApiKind, Endpoint, EndpointMetrics, EndpointView, InferenceRequest, Usage
from kvgate.simulator import cli as sim_cli
from kvgate.simulator import tokenizer
from kvgate.simulator.engine import Engine, Finished, FirstToken, SimRequest
from kvgate.simulator.profiles import load_profile as load_latency_profile


@dataclass
class RequestRecord:
    """One request as replayed (times in simulated seconds)."""

    index: int
    at: float
    key: str
    replica: int
    previous: int | None  # replica the same prefix key was last sent to
    counted: bool  # after the warm-up
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: float = float("nan")

    @property
    def reread(self) -> bool:
        """A repeated key whose prompt mostly missed the cache where it went."""
        return self.previous is not None and self.cached_tokens < self.prompt_tokens // 2


@dataclass
class ReplayResult:
    records: list[RequestRecord] = field(default_factory=list)
    hits: int = 0
    queries: int = 0

    @property
    def moved(self) -> int:
        """Requests not sent where their prefix key was last sent (to another holder, or a re-read)."""
        return sum(1 for r in self.records if r.previous is not None and r.previous != r.replica)

    @property
    def rereads(self) -> int:
        return sum(1 for r in self.records if r.reread)

    @property
    def ttfts_ms(self) -> list[float]:
        return [r.ttft * 1e3 for r in self.records if r.counted]

    def percentile(self, q: float) -> float:
        """TTFT percentile in ms over the counted requests (``q`` in [0, 100], as ``bench.run_stats``)."""
        return percentile(self.ttfts_ms, q)


def engines_for(spec: WorkloadSpec) -> list[Engine]:
    args = sim_cli.build_parser().parse_args(["--replicas", str(spec.fleet.replicas), *spec.fleet.args()])
    config = sim_cli.fleet_config(args)
    return [Engine(r.engine, load_latency_profile(r.profile)) for r in config.replicas]


def endpoint_metrics(engine: Engine, now: float) -> EndpointMetrics:
    m = engine.metrics()
    return EndpointMetrics(
        waiting=m.waiting, running=m.running, kv_cache_usage=m.kv_cache_usage,
        active_loras=frozenset(m.running_loras), waiting_loras=frozenset(m.waiting_loras),
        max_loras=m.max_loras if m.served_loras else 0, block_size=m.block_size,
        num_gpu_blocks=m.num_gpu_blocks, updated_at=now, served_models=frozenset({m.model}),
    )


def prefix_key(body: dict[str, object], spec: WorkloadSpec) -> str:
    """What a request shares with earlier ones: its document / system prompt / chat (first 64 chars)."""
    if "messages" in body:
        messages = body["messages"]
        assert isinstance(messages, list)
        return "|".join(str(m.get("content", ""))[:32] for m in messages[:2])
    prompt = str(body.get("prompt", ""))
    return prompt[:64] if spec.kind != "lora-mix" else str(body.get("model"))


class Replay:
    """One replay: the fleet's engines, kvgate's scheduler, and the scraped views between them."""

    def __init__(self, spec: WorkloadSpec, profile_path: str, scrape_interval: float, seed: int,
                 explain: int = 0) -> None:
        self.spec = spec
        self.engines = engines_for(spec)
        self.endpoints = [Endpoint(f"10.0.0.{i + 1}:8000", "pool") for i in range(len(self.engines))]
        self.scheduler = ProfileScheduler(load_profile(profile_path), rng=random.Random(seed))
        # a new tuple per scrape, naming the endpoint rescraped, as the scraper publishes them (the
        # scheduler's per-snapshot memos and the candidate set's incremental ranking trust a tuple
        # they have seen not to change)
        self.views = PoolViews.after(None, (EndpointView(e, None, True) for e in self.endpoints), None)
        self.scrape_interval = scrape_interval
        self.explain_left = explain
        self._last_pick: dict[str, int] = {}
        self._in_flight: dict[str, tuple[InferenceRequest, RequestRecord]] = {}
        self._events: list[tuple[float, int, int, str, int]] = []  # (time, order, seq, kind, index)
        self._seq = 0

    def _push(self, at: float, order: int, kind: str, index: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, order, self._seq, kind, index))

    def run(self, planned: Sequence[tuple[float, bytes]], warmup: int) -> ReplayResult:
        """Play ``planned`` ((arrival, body) in arrival order); the first ``warmup`` are not counted."""
        result = ReplayResult()
        end_of_plan = planned[-1][0] if planned else 0.0
        for i in range(len(self.engines)):  # staggered like independent scrape loops
            self._push(i * self.scrape_interval / len(self.engines), 2, "scrape", i)
        for index, (at, _) in enumerate(planned):
            self._push(at, 1, "arrive", index)
        in_step = [False] * len(self.engines)
        while self._events:
            now, _, _, kind, index = heapq.heappop(self._events)
            if kind == "scrape":
                metrics = endpoint_metrics(self.engines[index], now)
                scraped = EndpointView(self.endpoints[index], metrics, True)
                replaced = (*self.views[:index], scraped, *self.views[index + 1 :])
                self.views = PoolViews.after(self.views, replaced, {scraped.address})
                if now <= end_of_plan or self._in_flight:
                    self._push(now + self.scrape_interval, 2, "scrape", index)
            elif kind == "arrive":
                result.records.append(self._arrive(now, index, planned[index][1], index >= warmup))
            else:  # a step of replica ``index`` ends
                in_step[index] = False
                self._step_ended(index, now)
            for i, engine in enumerate(self.engines):
                if not in_step[i] and engine.has_work():
                    duration = engine.begin_step(now)
                    if duration is not None:
                        in_step[i] = True
                        self._push(now + duration, 0, "step-end", i)
        for engine in self.engines:
            m = engine.metrics()
            result.hits += m.prefix_cache_hits
            result.queries += m.prefix_cache_queries
        return result

    def _step_ended(self, replica: int, now: float) -> None:
        endpoint = self.endpoints[replica]
        for event in self.engines[replica].end_step(now):
            if isinstance(event, FirstToken):
                request, record = self._in_flight[event.request_id]
                self.scheduler.on_first_token(request, endpoint, now)
                record.ttft = now - record.at
                record.prompt_tokens, record.cached_tokens = event.prompt_tokens, event.cached_tokens
            elif isinstance(event, Finished):
                request, _ = self._in_flight.pop(event.request_id)
                usage = Usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
                self.scheduler.on_usage(request, endpoint, usage, now)
                self.scheduler.on_finished(request, endpoint, ok=True, now=now)

    def _arrive(self, now: float, index: int, body: bytes, counted: bool) -> RequestRecord:
        doc = json.loads(body)
        api = ApiKind.CHAT_COMPLETIONS if "messages" in doc else ApiKind.COMPLETIONS
        parsed = parse_request_body(api, body)
        request = InferenceRequest(request_id=f"r{index}", pool="pool", model=parsed.model,
                                   target_model=parsed.model, api=api, prompt=parsed.prompt, stream=True,
                                   max_tokens=parsed.max_tokens, body_size=len(body))
        key = prefix_key(doc, self.spec)
        previous = self._last_pick.get(key)
        explain = previous is not None and counted and self.explain_left > 0
        estimates = self._estimates(request, now) if explain else None
        pick = self.endpoints.index(self.scheduler.schedule(request, self.views, now).pick)
        if estimates is not None and pick != previous:
            self.explain_left -= 1
            self._explain(now, index, request, previous, pick, estimates)
        self.scheduler.on_picked(request, self.endpoints[pick], now)
        self._last_pick[key] = pick
        chat = api is ApiKind.CHAT_COMPLETIONS
        prompt = tokenizer.render_chat(doc["messages"]) if chat else str(doc["prompt"])
        engine = self.engines[pick]
        lora = parsed.model if parsed.model in engine.config.served_loras else None
        engine.submit(SimRequest(request.request_id, tuple(tokenizer.encode(prompt)), parsed.max_tokens or 16,
                                 lora), now)
        record = RequestRecord(index, now, key, pick, previous, counted)
        self._in_flight[request.request_id] = (request, record)
        return record

    def _estimates(self, request: InferenceRequest, now: float) -> list[float]:
        """The estimated-TTFT scorer's estimates for ``request`` now (what ``--explain`` prints)."""
        s = self.scheduler
        scorer = next(w.plugin for w in s.profile.scorers if w.plugin_type == "estimated-ttft-scorer")
        estimates: list[float] = scorer.estimates(s.context(request, now), self.views)  # type: ignore[attr-defined]
        return estimates

    def _explain(self, now: float, index: int, request: InferenceRequest, previous: int | None, pick: int,
                 estimates: list[float]) -> None:
        s = self.scheduler
        inflight = s.state.inflight_by_endpoint()
        matches = s.context(request, now).prefix_matches()
        tokens = request.prompt_tokens_estimate
        print(f"t={now:8.3f} req {index} ({tokens} tok): replica {previous} -> {pick}")
        for i, (view, estimate) in enumerate(zip(self.views, estimates, strict=True)):
            m = view.metrics
            own = inflight.get(view.address)
            true = self.engines[i].metrics()
            mark = "<-prev" if i == previous else ("<-pick" if i == pick else "")
            age_ms = (now - m.updated_at) * 1e3 if m else 0.0
            scraped = f"w={m.waiting} r={m.running} age={age_ms:4.1f}ms" if m else "unscraped"
            print(f"   {i}: est {estimate * 1e3:7.1f} ms  matched {matches.get(view.address, 0):4d} blk  "
                  f"scrape {scraped}  own req={own.requests if own else 0} tok={own.tokens if own else 0}  "
                  f"true w={true.waiting} r={true.running} {mark}")


def timeline(records: Sequence[RequestRecord], bucket_s: float) -> list[str]:
    """Per arrival-time bucket: requests, p90 TTFT and re-reads (what a warm-up hides or not)."""
    rows: dict[int, list[RequestRecord]] = {}
    for r in records:
        rows.setdefault(int(r.at // bucket_s), []).append(r)
    out = []
    for b in sorted(rows):
        p90 = percentile([r.ttft * 1e3 for r in rows[b]], 90)
        rereads = sum(r.reread for r in rows[b])
        span = f"{b * bucket_s:5.2f}-{(b + 1) * bucket_s:5.2f} s"
        out.append(f"  {span}: {len(rows[b]):4d} req  p90 {p90:7.1f} ms  re-reads {rereads}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvgate.bench.replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="long-prompts")
    p.add_argument("--hetero", action="store_true")
    p.add_argument("--replicas", type=int, default=0,
                   help="the fleet's size instead of the workload's (the offered rate scales with it)")
    p.add_argument("--fraction", type=float, default=0.9)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--profile", default=str(Path(__file__).parents[1] / "policies/profiles/default.yaml"))
    p.add_argument("--scrape-interval", type=float, default=0.05, help="simulated seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--explain", type=int, default=0, help="print the estimates of the first N moved requests")
    p.add_argument("--timeline", type=float, default=0.0, metavar="SECONDS",
                   help="print p90 TTFT and re-reads per arrival-time bucket of this width")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    spec = WORKLOADS[args.workload].with_output_tokens(args.output_tokens)
    if args.hetero:
        spec = spec.with_fleet(spec.fleet.heterogeneous(), f"{spec.name}-hetero")
    if args.replicas:
        spec = spec.with_fleet(dataclasses.replace(spec.fleet, replicas=args.replicas),
                               f"{spec.name}-r{args.replicas}")
    rate = offered_rate(spec, args.fraction)
    planned, warmup = run_plan(spec, rate, args.fraction, args.requests, args.seed)
    replay = Replay(spec, args.profile, args.scrape_interval, args.seed, args.explain)
    result = replay.run([(r.at_s, r.body) for r in planned], warmup)
    hit = result.hits / result.queries if result.queries else 0.0
    print(f"{spec.name} {args.fraction}x ({rate:g} req/s, {len(planned)} requests, {warmup} warm-up), "
          f"profile {args.profile}")
    print(f"  TTFT ms p50 {result.percentile(50):.1f}  p90 {result.percentile(90):.1f}  "
          f"p99 {result.percentile(99):.1f}  hit {hit:.1%}  moved {result.moved}  "
          f"re-reads {result.rereads}")
    if args.timeline:
        print("\n".join(timeline(result.records, args.timeline)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
