"""The sans-IO simulated vLLM engine: continuous batching, chunked prefill, KV blocks, LoRA slots.

The engine never reads a clock and does no IO: callers pass ``now`` (simulated seconds) and drive
steps with ``begin_step(now) -> duration`` and, ``duration`` later, ``end_step(now) -> events``. The
server plays it in real time; ``simulator.virtual_time`` plays it in virtual time.

One step (vLLM v1's scheduler, simplified):

1. Running requests, oldest first, each get the tokens they still need (1 when decoding; the rest of
   their prompt when prefilling), within the step's ``max_num_batched_tokens`` budget (chunked
   prefill). A request that needs a new KV block when none is free preempts the newest running
   request (recompute: its blocks are freed, it goes back to the front of the queue with nothing
   computed; its prompt blocks usually survive in the prefix cache).
2. If nothing was preempted, waiting requests are admitted in order while the budget lasts and fewer
   than ``max_num_seqs`` run. A request's cached prefix (see ``kv_cache``) is reused, the rest is
   computed, in chunks if the budget is short. A request whose blocks don't fit waits, and so does
   everyone behind it; a request whose adapter has no free slot waits and is passed (see
   ``lora_slots``).
3. Step time = ``profile.step_time(uncached prefill tokens, decoding sequences, batch) * slowdown``
   plus ``lora_load_time`` per adapter loaded for the step.

When a request's last prompt chunk is computed it gets its first token (``FirstToken`` then
``TokenOut(index=0)``); each later step in which it decodes makes one more ``TokenOut``; after
``max_tokens`` tokens it is ``Finished`` and its blocks are released. Nothing is dropped: every
submitted request ends ``Finished`` unless aborted. Requests submitted while a step is in flight join
the next step. Prefix-cache counters follow vLLM: on each admission, queries grow by the request's
tokens and hits by the tokens served from cache (again after a preemption); ``cached_tokens`` in the
events is the hit at the first admission.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from kvgate.simulator.engine_types import (
    CacheEvent,
    EngineConfig,
    EngineEvent,
    EngineMetrics,
    Finished,
    FirstToken,
    PeekResult,
    Removed,
    SimRequest,
    StepPlan,
    Stored,
    TokenOut,
)
from kvgate.simulator.engine_wait import estimate_wait
from kvgate.simulator.kv_cache import KVCache, prompt_block_hashes
from kvgate.simulator.lora_slots import LoraSlots
from kvgate.simulator.media import block_media
from kvgate.simulator.profiles import LatencyProfile

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineEvent",
    "EngineMetrics",
    "Finished",
    "FirstToken",
    "PeekResult",
    "SimRequest",
    "StepPlan",
    "TokenOut",
]

_WAITING, _RUNNING, _DONE = 0, 1, 2


class _Seq:
    """The engine's mutable state of one request."""

    __slots__ = (
        "arrival", "blocks", "cached_tokens", "first_token_time", "hashes", "hold_kv", "lora",
        "max_tokens", "media", "num_computed", "num_hashed", "num_output", "prompt_len", "remote_blocks",
        "request_id", "salt", "state", "tokens",
    )

    def __init__(self, request: SimRequest, arrival: float, hashes: tuple[int, ...],
                 tokens: tuple[int, ...]) -> None:
        self.request_id = request.request_id
        self.lora = request.lora
        self.salt = request.cache_salt
        self.media = request.media
        self.prompt_len = len(request.prompt_tokens)
        self.tokens = tokens  # the prompt (and the output's ids where known): the KV events' tokens
        self.max_tokens = request.max_tokens
        self.arrival = arrival
        self.hashes = hashes  # chained hashes of the full blocks of ``tokens``, computed once
        self.blocks: list[int] = []
        self.num_computed = 0  # tokens whose KV is computed (prompt + output)
        self.num_hashed = 0  # leading blocks registered in the prefix cache
        self.num_output = 0
        self.cached_tokens = -1  # prefix hit at the first admission
        self.first_token_time = -1.0
        self.state = _WAITING
        self.hold_kv = request.hold_kv
        self.remote_blocks = 0  # whole blocks received from a remote prefill (set by the engine)


class Engine:
    """One simulated vLLM replica's engine (see the module docstring)."""

    def __init__(self, config: EngineConfig, profile: LatencyProfile) -> None:
        self.config = config
        self.profile = profile
        self._kv = KVCache(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching)
        self._kv_events: list[CacheEvent] | None = [] if config.kv_events else None
        """Blocks stored and evicted since the last ``take_kv_events`` (vLLM's KV events), or None."""
        if self._kv_events is not None:
            self._kv.on_evict = self._evicted
        self._loras = LoraSlots(config.max_loras, config.served_loras)
        self._seqs: dict[str, _Seq] = {}  # in flight: waiting or running
        self._held: dict[str, list[int]] = {}  # finished prefills' blocks kept for a remote decode
        self._waiting: deque[_Seq] = deque()  # may hold aborted entries (state _DONE), skipped lazily
        self._num_waiting = 0
        self._waiting_tokens = 0  # tokens still to compute by waiting requests (before cache hits)
        self._running: list[_Seq] = []  # admission order; preemption takes the last
        self._running_loras: Counter[str] = Counter()
        self._waiting_loras: Counter[str] = Counter()
        self._plan: list[tuple[_Seq, int]] | None = None
        self.last_step: StepPlan | None = None
        self._queries = self._hits = self._prompt_total = self._gen_total = 0
        self._success = self._preemptions = self._submitted = self._aborted = 0

    # ---- requests ------------------------------------------------------------------------------
    def submit(self, request: SimRequest, now: float) -> None:
        """Queue a request; raises ``ValueError`` if it is malformed or could never fit."""
        cfg = self.config
        n = len(request.prompt_tokens)
        if n == 0:
            raise ValueError("the prompt is empty")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if request.request_id in self._seqs:
            raise ValueError(f"request {request.request_id!r} is already in flight")
        if request.lora is not None and not self._loras.is_served(request.lora):
            raise ValueError(f"LoRA adapter {request.lora!r} is not loaded")
        needed = -(-(n + request.max_tokens - 1) // cfg.block_size)
        if needed > cfg.num_gpu_blocks:
            raise ValueError(
                f"{n} prompt + {request.max_tokens} output tokens need {needed} KV blocks, "
                f"the cache has {cfg.num_gpu_blocks}"
            )
        hashes: tuple[int, ...] = ()
        tokens = request.prompt_tokens
        if request.output_tokens:  # what is computed of the output: all but the last token's KV
            tokens = tokens + request.output_tokens[:request.max_tokens - 1]
        if cfg.enable_prefix_caching:
            seed = request.lora or cfg.model
            hashes = prompt_block_hashes(tokens, cfg.block_size, seed, request.cache_salt, request.media)
        seq = _Seq(request, now, hashes, tokens)
        # whole received blocks, leaving at least the prompt's last token to compute here
        seq.remote_blocks = min(max(0, request.remote_tokens) // cfg.block_size, (n - 1) // cfg.block_size)
        self._seqs[seq.request_id] = seq
        self._enqueue(seq, front=False)
        self._submitted += 1

    def abort(self, request_id: str, now: float) -> None:
        """Drop a request (unknown or finished ids are ignored); no event follows for it."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        if seq.state == _WAITING:
            self._dequeued(seq)  # the deque entry is skipped later
        else:
            self._running.remove(seq)
            self._stop_running(seq)
        seq.state = _DONE
        self._aborted += 1

    def has_work(self) -> bool:
        return self._num_waiting > 0 or bool(self._running)

    def release_held(self, request_id: str) -> bool:
        """Let a finished prefill's held blocks go (read by the decode side, or expired); False when
        none are held under ``request_id``. They stay in the prefix cache until evicted."""
        blocks = self._held.pop(request_id, None)
        if blocks is None:
            return False
        self._kv.release(blocks)
        return True

    @property
    def held_requests(self) -> int:
        """Finished prefills whose blocks are held for a remote decode."""
        return len(self._held)

    # ---- LoRA registry ---------------------------------------------------------------------------
    def load_lora(self, name: str) -> None:
        self._loras.register(name)

    def unload_lora(self, name: str) -> None:
        self._loras.unregister(name, self._running_loras)

    # ---- stepping --------------------------------------------------------------------------------
    def begin_step(self, now: float) -> float | None:
        """Schedule the next step; returns its simulated duration, or None when there is nothing to do."""
        if self._plan is not None:
            raise RuntimeError("begin_step called twice without end_step")
        cfg = self.config
        kv = self._kv
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        plan: list[tuple[_Seq, int]] = []
        preempted: list[str] = []
        prefill = decode = decode_context = 0
        running = self._running

        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            remaining = seq.prompt_len + seq.num_output - seq.num_computed
            n = remaining if remaining < budget else budget
            end = seq.num_computed + n
            need = -(-end // bs) - len(seq.blocks)
            if need > 0:
                while need > kv.num_free and running[-1] is not seq:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                if need > kv.num_free:  # only itself left to preempt
                    running.pop()
                    self._preempt(seq)
                    preempted.append(seq.request_id)
                    break
                seq.blocks.extend(kv.allocate(need))
            if seq.num_output > 0 and remaining == 1:
                decode += 1
                decode_context += seq.num_computed
                if end > seq.prompt_len and len(seq.hashes) > seq.num_hashed:
                    self._register_full_blocks(seq, end)  # a generated block, full
            else:
                prefill += n
                self._register_full_blocks(seq, end)
            plan.append((seq, n))
            budget -= n
            i += 1

        if not preempted or not plan:  # vLLM admits nobody in a step that preempted
            budget, prefill = self._admit(plan, budget, prefill)

        self._plan = plan
        if not plan:
            self._plan = None
            return None
        in_use = self._running_loras
        loads = self._loras.ensure_resident({s.lora for s, _ in plan if s.lora is not None}, in_use)
        mean_context = decode_context // decode if decode else 0
        duration = self.profile.step_time(prefill, decode, len(plan), mean_context) * cfg.slowdown
        if loads:
            duration += cfg.lora_load_time * len(loads)
        self.last_step = StepPlan(prefill, decode, len(plan), loads, tuple(preempted), duration)
        return duration

    def _admit(self, plan: list[tuple[_Seq, int]], budget: int, prefill: int) -> tuple[int, int]:
        """Admit waiting requests into the step (phase 2); returns the budget and prefill left/used."""
        cfg = self.config
        kv = self._kv
        bs = cfg.block_size
        waiting = self._waiting
        running = self._running
        running_loras = self._running_loras
        skipped: list[_Seq] = []
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            seq = waiting[0]
            if seq.state != _WAITING:  # aborted while waiting
                waiting.popleft()
                continue
            lora = seq.lora
            if lora is not None and lora not in running_loras and len(running_loras) >= cfg.max_loras:
                skipped.append(waiting.popleft())
                continue
            total = seq.prompt_len + seq.num_output
            hits = kv.match_prefix(seq.hashes, (total - 1) // bs)
            computed = max(len(hits), seq.remote_blocks) * bs
            n = min(total - computed, budget)
            end = computed + n
            need = -(-end // bs) - len(hits)
            if need + kv.count_unreferenced(hits) > kv.num_free:
                break  # its blocks don't fit: it (and everyone behind it) waits
            waiting.popleft()
            self._dequeued(seq)
            kv.acquire(hits)
            seq.blocks = hits + kv.allocate(need)
            seq.num_computed = computed
            seq.num_hashed = len(hits)
            self._register_full_blocks(seq, end)
            self._queries += total
            self._hits += len(hits) * bs  # local hits only: received blocks are not cache hits
            if seq.cached_tokens < 0:
                seq.cached_tokens = computed
            seq.state = _RUNNING
            running.append(seq)
            if lora is not None:
                running_loras[lora] += 1
            plan.append((seq, n))
            budget -= n
            prefill += n
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget, prefill

    def end_step(self, now: float) -> list[EngineEvent]:
        """Apply the scheduled step at ``now`` (its end) and return what happened."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("end_step without begin_step")
        self._plan = None
        events: list[EngineEvent] = []
        finished = False
        for seq, n in plan:
            if seq.state != _RUNNING:  # aborted during the step
                continue
            seq.num_computed += n
            if seq.num_computed < seq.prompt_len + seq.num_output:
                continue  # a prefill chunk; more to come
            index = seq.num_output
            seq.num_output = index + 1
            self._gen_total += 1
            if seq.first_token_time < 0:
                seq.first_token_time = now
                self._prompt_total += seq.prompt_len
                events.append(FirstToken(seq.request_id, now, seq.prompt_len, seq.cached_tokens))
            events.append(TokenOut(seq.request_id, now, index))
            if seq.num_output >= seq.max_tokens:
                finished = True
                seq.state = _DONE
                del self._seqs[seq.request_id]
                held = self._hold_prompt_blocks(seq) if seq.hold_kv else ()
                self._stop_running(seq)
                self._success += 1
                events.append(
                    Finished(
                        seq.request_id, now, seq.prompt_len, seq.num_output, seq.cached_tokens,
                        seq.first_token_time - seq.arrival, now - seq.arrival, held,
                        seq.remote_blocks * self.config.block_size,
                    )
                )
        if finished:
            self._running = [s for s in self._running if s.state == _RUNNING]
        return events

    # ---- read-only -------------------------------------------------------------------------------
    def peek(self, prompt_tokens: Sequence[int], lora: str | None, now: float,
             cache_salt: str | None = None, media: Sequence[tuple[str, int, int]] = ()) -> PeekResult:
        """What a request would meet now: cached prefix, queue, a rough wait. Changes no state."""
        cfg = self.config
        n = len(prompt_tokens)
        cached = 0
        if cfg.enable_prefix_caching and n > 0:
            hashes = prompt_block_hashes(prompt_tokens, cfg.block_size, lora or cfg.model, cache_salt, media)
            cached = len(self._kv.match_prefix(hashes, (n - 1) // cfg.block_size)) * cfg.block_size
        wait = estimate_wait(
            self.profile, cfg, uncached=n - cached, queued_tokens=self._waiting_tokens,
            running=len(self._running),
            lora_load=lora is not None and not self._loras.is_resident(lora),
        )
        return PeekResult(cached, self._num_waiting, len(self._running), wait)

    def metrics(self) -> EngineMetrics:
        cfg = self.config
        return EngineMetrics(
            model=cfg.model,
            waiting=self._num_waiting,
            running=len(self._running),
            kv_cache_usage=self._kv.usage,
            running_loras=tuple(sorted(self._running_loras)),
            waiting_loras=tuple(sorted(self._waiting_loras)),
            served_loras=self._loras.served,
            max_loras=cfg.max_loras,
            block_size=cfg.block_size,
            num_gpu_blocks=cfg.num_gpu_blocks,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            prompt_tokens_total=self._prompt_total,
            generation_tokens_total=self._gen_total,
            request_success_total=self._success,
            preemptions_total=self._preemptions,
            requests_submitted_total=self._submitted,
            requests_aborted_total=self._aborted,
            max_num_seqs=cfg.max_num_seqs,
        )

    @property
    def in_step(self) -> bool:
        """Whether a step is scheduled and not yet ended."""
        return self._plan is not None

    @property
    def kv_cache(self) -> KVCache:
        """The block pool (read it; do not mutate it)."""
        return self._kv

    @property
    def lora_slots(self) -> LoraSlots:
        """The adapter registry and GPU slots (read it; use load_lora/unload_lora to change it)."""
        return self._loras

    # ---- internals -------------------------------------------------------------------------------
    def _register_full_blocks(self, seq: _Seq, end: int) -> None:
        upto = min(end // self.config.block_size, len(seq.hashes))
        if upto > seq.num_hashed:
            register = self._kv.register
            events = self._kv_events
            size = self.config.block_size
            for b in range(seq.num_hashed, upto):
                if register(seq.blocks[b], seq.hashes[b]) and events is not None:
                    parent = seq.hashes[b - 1] if b else None
                    tokens = seq.tokens[b * size:(b + 1) * size]
                    media = block_media(seq.media, b * size, (b + 1) * size) if seq.media else ()
                    salt = None if b else seq.salt
                    events.append(Stored(seq.hashes[b], parent, tokens, seq.lora, salt, media))
            seq.num_hashed = upto

    def _evicted(self, block_hash: int) -> None:
        if self._kv_events is not None:
            self._kv_events.append(Removed(block_hash))

    def take_kv_events(self) -> list[CacheEvent]:
        """The KV events since the last call (empty unless ``EngineConfig.kv_events``)."""
        events = self._kv_events
        if not events:
            return []
        self._kv_events = []
        return events

    def _hold_prompt_blocks(self, seq: _Seq) -> tuple[int, ...]:
        """Reference the prompt's full blocks once more (vLLM's NixlConnector delays freeing them
        until the decode side has read them); a prompt shorter than a block holds none."""
        blocks = seq.blocks[: seq.prompt_len // self.config.block_size]
        if blocks:
            self._kv.acquire(blocks)
            self._held[seq.request_id] = list(blocks)
        return tuple(blocks)

    def _enqueue(self, seq: _Seq, front: bool) -> None:
        seq.state = _WAITING
        if front:
            self._waiting.appendleft(seq)
        else:
            self._waiting.append(seq)
        self._num_waiting += 1
        self._waiting_tokens += self._tokens_to_compute(seq)
        if seq.lora is not None:
            self._waiting_loras[seq.lora] += 1

    def _dequeued(self, seq: _Seq) -> None:
        self._num_waiting -= 1
        self._waiting_tokens -= self._tokens_to_compute(seq)
        if seq.lora is not None:
            _decrement(self._waiting_loras, seq.lora)

    def _tokens_to_compute(self, seq: _Seq) -> int:
        done = max(seq.num_computed, seq.remote_blocks * self.config.block_size)
        return seq.prompt_len + seq.num_output - done

    def _stop_running(self, seq: _Seq) -> None:
        """Release a running request's blocks and adapter use (the caller fixes ``_running``)."""
        self._kv.release(seq.blocks)
        seq.blocks = []
        if seq.lora is not None:
            _decrement(self._running_loras, seq.lora)

    def _preempt(self, seq: _Seq) -> None:
        """Recompute preemption: free everything, back to the front of the queue."""
        self._stop_running(seq)
        seq.num_computed = 0
        seq.num_hashed = 0
        self._preemptions += 1
        self._enqueue(seq, front=True)


def _decrement(counter: Counter[str], key: str) -> None:
    left = counter[key] - 1
    if left > 0:
        counter[key] = left
    else:
        del counter[key]
