"""Routing-benchmark workloads: deterministic request plans from a seed (pure, no IO).

A workload is a :class:`WorkloadSpec` (what the requests look like and which fleet serves them) and
:func:`plan` turns it into open-loop Poisson arrivals at a rate (simulated requests/s) over a
duration (simulated seconds). Text is the simulator's filler words from a seeded generator (4
characters and one token each, under the simulator's own rule and in its tokenizer.json alike), so
the same seed gives byte-identical bodies for every contender.

Workloads (``WORKLOADS``):

- ``shared-prefix-fit``: 64 groups × 2,048-token system prompt + 128-token question. Replicas have
  2,400 KV blocks (38,400 tokens) each: one replica holds ~18 of the 64 prefixes (64 × 128 blocks =
  8,192 blocks), the fleet's 19,200 blocks hold all of them when groups are partitioned across
  replicas. Round robin sends every group everywhere and thrashes each replica's LRU.
- ``shared-prefix-exceed``: 256 zipf(1.0)-popular groups (32,768 prefix blocks) on the same fleet
  (19,200 blocks): the working set exceeds the fleet's caches; the hottest group gets ~16 % of the
  traffic, more than one replica's share, so hot groups need several replicas.
- ``shared-prefix-exceed-uniform``: the same 256 groups, equally popular: every replica's cache
  turns over (whatever a router guesses of it goes stale fastest here).
- ``multi-turn``: sessions (Poisson starts) of up to 6 chat turns 4 simulated seconds apart (closer
  when the arrival window is shorter than a session: ``_plan_chat``); each turn
  re-sends the whole history (shared 512-token system prompt + 96-token user turns + the assistant
  replies as the simulator writes them).
- ``lora-mix``: 15 adapters in three popularity groups of 5 (60 / 30 / 10 % of the traffic),
  ``max_loras`` 3 per replica, unique 512-token prompts.
- ``long-prompts``: 8k-32k-token prompts (32-128 KB bodies; about 60 % over 100 KB) over 24 shared
  documents with a short unique question.
- ``agent-messages``: agents speaking Anthropic's Messages API (``/v1/messages``, as coding agents
  do to a vLLM fleet): 16 agents, each a 1,024-token system prompt and 8 tools (~1k tokens), in
  sessions of 6 turns 4 simulated seconds apart; every turn after the first resends the history
  with the assistant's reply and tool call and the tool's result (96 tokens).

The disaggregated-serving benchmark's workloads (``PD_WORKLOADS``, ``bench.pd``): unique prompts
(nothing cached) of a uniform length between ``extra["min_tokens"]`` and ``extra["max_tokens"]``:

- ``pd-long``: 4k-16k-token prompts, 256 output tokens: prefill-heavy requests whose prefill chunks,
  on an aggregated replica, share the engine steps of every other request's decode.
- ``pd-short``: 128-512-token prompts, 256 output tokens: nothing worth a prefill hop.

and ``pd-docs``, ``long-prompts`` as a P/D workload (retrieval over shared documents): where the
decode endpoint already holds the document, only the question is left to prefill.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from kvgate.simulator.tokenizer import WORDS, output_text

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_MODEL = Path(__file__).resolve().parents[1] / "simulator" / "data"
"""The simulated model's directory: its tokenizer.json and chat template (``kvgate.io/tokenizer``)."""
CHARS_PER_TOKEN = 4
# docs/simulator.md: one engine step = 5752.7 µs + 17.25 µs × prefill + 6 µs × decode tokens.
STEP_S = 0.0057527
PREFILL_S_PER_TOKEN = 17.25e-6
DECODE_S_PER_TOKEN = 6.0e-6
REFERENCE_BATCH = 16  # decode batch assumed by the capacity estimate


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """How the simulated fleet is started for a workload (``python -m kvgate.simulator`` flags)."""

    replicas: int = 8
    num_gpu_blocks: int = 27_000
    loras: tuple[str, ...] = ()
    max_loras: int = 4
    overrides: tuple[str, ...] = ()  # --replica I:KEY=VALUE,...
    stream_interval: int = 1  # tokens per SSE chunk (1: one chunk per token, vLLM's default)
    prefill: int = 0
    """Of ``replicas``, how many are prefill instances (the first ones), and ``decode`` decode ones
    (next); the rest serve both (a disaggregated fleet: ``kvgate sim --prefill P --decode D``)."""
    decode: int = 0
    kv_bandwidth_gbs: float | None = None
    """The KV transfer's bandwidth between prefill and decode instances (``kvgate sim
    --kv-bandwidth-gbs``; None: the simulator's default, 40)."""
    kv_events: bool = False
    """The replicas publish vLLM's KV-cache events and tokenize with the simulated model's tokenizer
    (``kvgate sim --kv-events-port --tokenizer``; ``bench.sim_fleet`` gives them addresses)."""

    @property
    def roles(self) -> tuple[str, ...]:
        both = self.replicas - self.prefill - self.decode
        return ("prefill",) * self.prefill + ("decode",) * self.decode + ("both",) * both

    def split(self, prefill: int, decode: int) -> FleetSpec:
        """This fleet as ``prefill`` prefill and ``decode`` decode instances (and no others)."""
        return dataclasses.replace(self, replicas=prefill + decode, prefill=prefill, decode=decode)

    def args(self) -> list[str]:
        if self.prefill or self.decode:
            sizes = ["--prefill", str(self.prefill), "--decode", str(self.decode),
                     "--replicas", str(self.replicas - self.prefill - self.decode)]
        else:
            sizes = ["--replicas", str(self.replicas)]
        out = [*sizes, "--num-gpu-blocks", str(self.num_gpu_blocks), "--max-loras", str(self.max_loras)]
        if self.stream_interval != 1:
            out += ["--stream-interval", str(self.stream_interval)]
        if self.kv_bandwidth_gbs is not None:
            out += ["--kv-bandwidth-gbs", f"{self.kv_bandwidth_gbs:g}"]
        if self.loras:
            out += ["--loras", ",".join(self.loras)]
        for override in self.overrides:
            out += ["--replica", override]
        if self.kv_events:
            out += ["--tokenizer", str(SIM_MODEL / "tokenizer.json")]
        return out

    def heterogeneous(self) -> FleetSpec:
        """Replica 0 with half the KV cache, replica 1 1.5× slower (the issue's heterogeneous fleet)."""
        half = max(1, self.num_gpu_blocks // 2)
        return dataclasses.replace(self, overrides=(f"0:num_gpu_blocks={half}", "1:slowdown=1.5"))


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    kind: str  # shared-prefix | multi-turn | lora-mix | long-prompts | agent-messages
    fleet: FleetSpec
    output_tokens: int = 256
    groups: int = 64
    prefix_tokens: int = 2048
    question_tokens: int = 128
    zipf_s: float = 0.0  # 0: uniform group popularity
    turns: int = 6
    turn_gap_s: float = 4.0
    description: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    def with_output_tokens(self, tokens: int) -> WorkloadSpec:
        return WorkloadSpec(self.name, self.kind, self.fleet, tokens, self.groups, self.prefix_tokens,
                            self.question_tokens, self.zipf_s, self.turns, self.turn_gap_s,
                            self.description, self.extra)

    def with_fleet(self, fleet: FleetSpec, name: str) -> WorkloadSpec:
        return WorkloadSpec(name, self.kind, fleet, self.output_tokens, self.groups, self.prefix_tokens,
                            self.question_tokens, self.zipf_s, self.turns, self.turn_gap_s,
                            self.description, self.extra)


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a plan: sent at simulated time ``at_s`` to ``path`` with ``body``."""

    index: int
    at_s: float
    path: str
    body: bytes
    model: str
    prompt_tokens: int
    output_tokens: int
    headers: tuple[tuple[str, str], ...] = ()
    """Sent besides ``content-type`` (a tenant, an objective)."""


LORAS = tuple(f"lora-{i:02d}" for i in range(15))
LORA_GROUP_SHARE = (0.6, 0.3, 0.1)

WORKLOADS: dict[str, WorkloadSpec] = {
    "shared-prefix-fit": WorkloadSpec(
        "shared-prefix-fit", "shared-prefix", FleetSpec(num_gpu_blocks=2400),
        description="64 groups x 2,048-token system prompt + 128-token question; prefixes fit the "
                    "fleet's caches (8,192 of 19,200 blocks) but not one replica's (2,400)"),
    "shared-prefix-exceed": WorkloadSpec(
        "shared-prefix-exceed", "shared-prefix", FleetSpec(num_gpu_blocks=2400), groups=256, zipf_s=1.0,
        description="256 zipf(1.0) groups x 2,048-token system prompt + 128-token question; working "
                    "set 32,768 blocks > the fleet's 19,200"),
    "shared-prefix-exceed-uniform": WorkloadSpec(
        "shared-prefix-exceed-uniform", "shared-prefix", FleetSpec(num_gpu_blocks=2400), groups=256,
        description="256 equally popular groups x 2,048-token system prompt + 128-token question; "
                    "working set 32,768 blocks > the fleet's 19,200"),
    "multi-turn": WorkloadSpec(
        "multi-turn", "multi-turn", FleetSpec(num_gpu_blocks=4000), groups=16, prefix_tokens=512,
        question_tokens=96, description="chat sessions of 6 turns 4 s apart, growing history"),
    "lora-mix": WorkloadSpec(
        "lora-mix", "lora-mix", FleetSpec(loras=LORAS, max_loras=3), prefix_tokens=0, question_tokens=512,
        description="15 adapters, popularity 60/30/10 % over three groups of 5, max_loras 3, "
                    "unique 512-token prompts"),
    "long-prompts": WorkloadSpec(
        "long-prompts", "long-prompts", FleetSpec(), groups=24, prefix_tokens=8192, question_tokens=64,
        description="24 documents of 8k-32k tokens (bodies 32-128 KB) + 64-token question"),
    "agent-messages": WorkloadSpec(
        "agent-messages", "agent-messages", FleetSpec(num_gpu_blocks=4000), groups=16, prefix_tokens=1024,
        question_tokens=96, description="Anthropic Messages API agents: 16 system prompts + 8 tools each, "
                                        "sessions of 6 turns with tool calls and results, 4 s apart"),
}


PD_WORKLOADS: dict[str, WorkloadSpec] = {
    "pd-long": WorkloadSpec(
        "pd-long", "unique-prompts", FleetSpec(), prefix_tokens=0, question_tokens=0,
        extra={"min_tokens": 4096, "max_tokens": 16384},
        description="unique 4k-16k-token prompts (uniform), 256 output tokens"),
    "pd-short": WorkloadSpec(
        "pd-short", "unique-prompts", FleetSpec(), prefix_tokens=0, question_tokens=0,
        extra={"min_tokens": 128, "max_tokens": 512},
        description="unique 128-512-token prompts (uniform), 256 output tokens"),
    "pd-docs": WorkloadSpec(
        "pd-docs", "long-prompts", FleetSpec(), groups=24, prefix_tokens=8192, question_tokens=64,
        description="24 shared documents of 8k-32k tokens + a unique 64-token question, 256 output tokens"),
}


def text_of(rng: random.Random, tokens: int) -> str:
    """``tokens`` words of 4 characters (``simulator.tokenizer.WORDS``: a token each)."""
    return "".join(rng.choices(WORDS, k=tokens)) if tokens > 0 else ""


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank + 1) ** s for rank in range(n)]


def _body(payload: dict[str, object]) -> bytes:
    payload["stream"] = True
    payload["stream_options"] = {"include_usage": True}
    return json.dumps(payload, separators=(",", ":")).encode()


def poisson_times(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _doc_tokens(spec: WorkloadSpec, group: int, seed: int) -> int:
    if spec.kind != "long-prompts":
        return spec.prefix_tokens
    return random.Random(seed * 7919 + group).randint(8192, 32768 - spec.question_tokens - 64)


def plan(spec: WorkloadSpec, rate: float, duration_s: float, seed: int) -> list[PlannedRequest]:
    """The requests of one run (deterministic in ``spec``, ``rate``, ``duration_s``, ``seed``)."""
    if spec.kind == "multi-turn":
        return _plan_chat(spec, rate, duration_s, seed)
    if spec.kind == "agent-messages":
        return _plan_agents(spec, rate, duration_s, seed)
    rng = random.Random(seed)
    prefix_rng = random.Random(seed + 1)
    prefixes = [text_of(prefix_rng, _doc_tokens(spec, g, seed)) for g in range(spec.groups)]
    weights = zipf_weights(spec.groups, spec.zipf_s) if spec.zipf_s > 0 else None
    lora_weights = [LORA_GROUP_SHARE[i // 5] / 5 for i in range(len(LORAS))]
    out: list[PlannedRequest] = []
    for index, at in enumerate(poisson_times(rng, rate, duration_s)):
        model = MODEL
        if spec.kind == "lora-mix":
            model = rng.choices(LORAS, lora_weights)[0]
            prefix = ""
        elif spec.kind == "unique-prompts":
            prefix = text_of(rng, rng.randint(int(spec.extra["min_tokens"]), int(spec.extra["max_tokens"])))
        elif weights is not None:
            prefix = prefixes[rng.choices(range(spec.groups), weights)[0]]
        else:
            prefix = prefixes[rng.randrange(spec.groups)]
        prompt = prefix + text_of(rng, spec.question_tokens)
        body = _body({"model": model, "prompt": prompt, "max_tokens": spec.output_tokens})
        out.append(PlannedRequest(index, at, "/v1/completions", body, model,
                                  len(prompt) // CHARS_PER_TOKEN, spec.output_tokens))
    return out


def _plan_chat(spec: WorkloadSpec, rate: float, duration_s: float, seed: int) -> list[PlannedRequest]:
    """Sessions start at ``rate / turns`` per second so the request rate is about ``rate``.

    Turns are ``turn_gap_s`` apart, or closer when the arrival window is shorter than a whole
    session (``duration_s / turns``): a 1-second quick window would otherwise hold first turns only.
    """
    rng = random.Random(seed)
    gap = min(spec.turn_gap_s, duration_s / spec.turns)
    systems = [text_of(random.Random(seed + 1 + g), spec.prefix_tokens) for g in range(spec.groups)]
    reply = "".join(output_text(i) for i in range(spec.output_tokens))
    raw: list[tuple[float, bytes, int]] = []
    for start in poisson_times(rng, rate / spec.turns, duration_s):
        messages: list[dict[str, str]] = [{"role": "system", "content": systems[rng.randrange(spec.groups)]}]
        chars = len(messages[0]["content"])
        for turn in range(spec.turns):
            at = start + turn * gap
            user = text_of(rng, spec.question_tokens)
            messages.append({"role": "user", "content": user})
            chars += len(user)
            if at < duration_s:
                body = _body({"model": MODEL, "messages": list(messages), "max_tokens": spec.output_tokens})
                raw.append((at, body, chars // CHARS_PER_TOKEN))
            messages.append({"role": "assistant", "content": reply})
            chars += len(reply)
    raw.sort(key=lambda item: item[0])
    return [PlannedRequest(i, at, "/v1/chat/completions", body, MODEL, tokens, spec.output_tokens)
            for i, (at, body, tokens) in enumerate(raw)]


AGENT_TOOLS = 8


def _plan_agents(spec: WorkloadSpec, rate: float, duration_s: float, seed: int) -> list[PlannedRequest]:
    """``_plan_chat``'s sessions in Anthropic's Messages API: each agent's system prompt and tools
    in front, then the turns (a user question; then the assistant's reply with a tool call, and the
    tool's result as the next user turn)."""
    rng = random.Random(seed)
    gap = min(spec.turn_gap_s, duration_s / spec.turns)
    made = random.Random(seed + 1)
    agents = [(text_of(made, spec.prefix_tokens),
               [{"name": f"tool_{g}_{t}", "description": text_of(made, 120),
                 "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
                for t in range(AGENT_TOOLS)]) for g in range(spec.groups)]
    reply = "".join(output_text(i) for i in range(spec.output_tokens))
    raw: list[tuple[float, bytes, int]] = []
    for start in poisson_times(rng, rate / spec.turns, duration_s):
        system, tools = agents[rng.randrange(spec.groups)]
        messages: list[dict[str, object]] = [{"role": "user", "content": text_of(rng, spec.question_tokens)}]
        chars = len(system) + len(json.dumps(tools)) + spec.question_tokens * CHARS_PER_TOKEN
        for turn in range(spec.turns):
            at = start + turn * gap
            if at < duration_s:
                body = json.dumps({"model": MODEL, "max_tokens": spec.output_tokens, "stream": True,
                                   "system": system, "tools": tools, "messages": list(messages)},
                                  separators=(",", ":")).encode()
                raw.append((at, body, chars // CHARS_PER_TOKEN))
            call = {"type": "tool_use", "id": f"toolu_{turn}", "name": str(tools[turn % AGENT_TOOLS]["name"]),
                    "input": {"query": text_of(rng, 4)}}
            result = text_of(rng, spec.question_tokens)
            messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}, call]})
            messages.append({"role": "user", "content": [{"type": "tool_result", "id": call["id"],
                                                          "content": result}]})
            chars += len(reply) + len(result) + 64
    raw.sort(key=lambda item: item[0])
    return [PlannedRequest(i, at, "/v1/messages", body, MODEL, tokens, spec.output_tokens)
            for i, (at, body, tokens) in enumerate(raw)]


WARMUP_FRACTION = 0.2
"""Requests sent in the first 20 % of a run's arrival window are warm-up: sent, not counted."""


def offered_rate(spec: WorkloadSpec, fraction: float) -> float:
    """Requests/s (simulated) of a run at ``fraction`` of the capacity estimate, as reports show it."""
    return round(capacity_estimate(spec) * fraction, 1)


def run_plan(spec: WorkloadSpec, rate: float, fraction: float, requests: int,
             seed: int) -> tuple[list[PlannedRequest], int]:
    """A run's plan and how many of its first requests are warm-up. ``requests`` are planned at 1.0 ×
    capacity: the arrival window is the same at every rate."""
    duration = requests / (rate / fraction)
    planned = plan(spec, rate, duration, seed)
    return planned, sum(1 for r in planned if r.at_s < WARMUP_FRACTION * duration)


def capacity_estimate(spec: WorkloadSpec) -> float:
    """Fleet requests/s (simulated) when every shared prefix hits: the scale rates are derived from.

    Per request a replica spends ``uncached prompt × 17.25 µs`` of prefill and ``output × (6 µs +
    step / REFERENCE_BATCH)`` of decode; slower replicas count for less.
    """
    uncached = spec.question_tokens
    if spec.kind == "unique-prompts":
        uncached = int((spec.extra["min_tokens"] + spec.extra["max_tokens"]) / 2)
    elif spec.kind == "long-prompts":
        uncached = spec.question_tokens + 2048  # documents mostly hit; some first reads
    elif spec.kind in ("multi-turn", "agent-messages"):
        uncached = spec.question_tokens + spec.output_tokens
    decode = spec.output_tokens * (DECODE_S_PER_TOKEN + STEP_S / REFERENCE_BATCH)
    busy = uncached * PREFILL_S_PER_TOKEN + decode
    speed = float(spec.fleet.replicas)
    if any("slowdown=1.5" in o for o in spec.fleet.overrides):
        speed -= 1.0 - 1.0 / 1.5
    return speed / busy
