"""The code examples of docs/architecture.md run as written: each Python block of its "Where to add
things", then its plugin used in a profile and scheduled with."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvgate.policies.profile import build_profile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Usage

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def examples() -> list[str]:
    section = DOC.read_text(encoding="utf-8").split("## Where to add things", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def run(block: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(block, str(DOC), "exec"), namespace)  # the documentation's own code
    return namespace


def test_the_scorer_example_scores_in_a_profile() -> None:
    scorer_block = next(block for block in examples() if "FewestRequestsScorer" in block)
    namespace = run(scorer_block)
    document = {"name": "doc", "plugins": [{"type": "fewest-requests-scorer"}, {"type": "max-score-picker"}],
                "profile": {"scorers": [{"plugin": "fewest-requests-scorer"}], "picker": "max-score-picker"}}
    s = ProfileScheduler(build_profile(document, namespace["registry"]))
    busy, idle = EndpointView(Endpoint("10.0.0.1:8000", "p")), EndpointView(Endpoint("10.0.0.2:8000", "p"))
    first = InferenceRequest("r1", "p", "m", "m", prompt="hello")
    s.on_picked(first, busy.endpoint, 0.0)
    second = InferenceRequest("r2", "p", "m", "m", prompt="hi")
    assert s.schedule(second, [busy, idle], 0.0).pick == idle.endpoint


def test_the_feedback_example_hears_usage() -> None:
    feedback_block = next(block for block in examples() if "FeedbackPlugin" in block)
    namespace = run(feedback_block)
    plugin = namespace["CachedTokensLogBlueprint"]().create(None)
    endpoint = Endpoint("10.0.0.1:8000", "p")
    plugin.on_usage(InferenceRequest("r1", "p", "m", "m"), endpoint, Usage(10, 1, cached_tokens=8), 0.0)
    assert plugin.reports == [("10.0.0.1:8000", 8)]
