"""Whether the engines hold the blocks kvgate keyed: a pool's keys checked against what its engines
report for the requests they served (issue 37; sans-IO).

kvgate keys a prompt with the tokenizer and chat template it was given. Where they are not the
engine's (another model's tokenizer, a server started with its own ``--chat-template``, a release
that renders a template otherwise), no key kvgate makes is one an engine reports: every followed
endpoint's match is zero, and routing on that is worse than the approximate guess it replaced, with
nothing failing. So each request served by an endpoint whose events are followed is checked: a
moment after it ended (``delay_s``, half a second: its events have arrived, an engine publishes
them every step; its blocks are cached, freed behind newer work), the last block kvgate keyed for
it should be in that endpoint's report. Checks run as requests start and end. An engine
frees a sequence's blocks tail first, so the last one held means all were.

Over the last ``window`` checks, once ``min_checks`` were made: under ``distrust_below`` of them
held, the pool's keys are not trusted (its scheduler then routes on the approximate index, and the
picker says so); trusted again at ``trust_at``. Evictions under memory pressure miss a few checks
of right keys; wrong keys miss nearly all (a prompt's first 16 tokens may still agree, its last
keyed block almost never does).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyCheckSettings:
    delay_s: float = 0.5
    window: int = 64
    min_checks: int = 32
    distrust_below: float = 0.1
    trust_at: float = 0.5


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """One request's check: the endpoint that served it, whether it holds the key, and whether the
    pool's keys are trusted after it."""

    endpoint: str
    held: bool
    trusted: bool


class KeyChecks:
    def __init__(self, settings: KeyCheckSettings | None = None, max_pending: int = 4096) -> None:
        self.settings = settings or KeyCheckSettings()
        self.max_pending = max_pending
        self.trusted = True
        self._expected: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """Request in flight → (the endpoint serving it, the last block kvgate keyed for it)."""
        self._due: deque[tuple[float, str, int]] = deque()
        """(when to look, endpoint, key) of ended requests, in the order they ended."""
        self._outcomes: deque[bool] = deque(maxlen=self.settings.window)

    def expect(self, request_id: str, endpoint: str, key: int) -> None:
        """``endpoint`` serves the request; ``key``: its prompt's last block as kvgate keyed it."""
        self._expected[request_id] = (endpoint, key)
        while len(self._expected) > self.max_pending:
            self._expected.popitem(last=False)

    def moved(self, request_id: str, endpoint: str) -> None:
        """Another endpoint serves the request (a fallback)."""
        entry = self._expected.get(request_id)
        if entry is not None:
            self._expected[request_id] = (endpoint, entry[1])

    def finished(self, request_id: str, now: float) -> None:
        """The request ended: checked ``delay_s`` from now. Whether it went well is not asked: on
        kvgate's one-pass data path the scheduler learns that later, per endpoint (Envoy's access
        log); a request that failed before its prefill counts as a miss, and failures far below
        ``1 - distrust_below`` of a window cannot distrust right keys."""
        entry = self._expected.pop(request_id, None)
        if entry is not None:
            self._due.append((now + self.settings.delay_s, *entry))
            while len(self._due) > self.max_pending:
                self._due.popleft()

    def forget_endpoint(self, endpoint: str) -> None:
        for request_id in [r for r, (e, _) in self._expected.items() if e == endpoint]:
            del self._expected[request_id]
        self._due = deque(entry for entry in self._due if entry[1] != endpoint)

    def poll(self, now: float, holds: Callable[[str, int], bool | None]) -> list[KeyCheck]:
        """Check the requests whose time has come: ``holds(endpoint, key)``, whether the endpoint's
        report holds the block (None where its events are no longer followed: not counted)."""
        due = self._due
        if not due or due[0][0] > now:
            return []
        checks: list[KeyCheck] = []
        outcomes = self._outcomes
        s = self.settings
        while due and due[0][0] <= now:
            _, endpoint, key = due.popleft()
            held = holds(endpoint, key)
            if held is None:
                continue
            outcomes.append(held)
            if len(outcomes) >= s.min_checks:
                share = sum(outcomes) / len(outcomes)
                if self.trusted and share < s.distrust_below:
                    self.trusted = False
                elif not self.trusted and share >= s.trust_at:
                    self.trusted = True
            checks.append(KeyCheck(endpoint, held, self.trusted))
        return checks
