"""The code examples of docs/architecture.md run as written: each Python block of its "Where to add
things" (a scorer, a feedback plugin, a metric dialect, a configuration provider), then put to use."""

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


def test_the_dialect_example_reads_a_page() -> None:
    namespace = run(next(block for block in examples() if "DialectSpec" in block))
    spec = namespace["spec"]
    page = "# TYPE myengine_queue_size gauge\nmyengine_queue_size 3\nmyengine_kv_used_ratio 0.25\n"
    metrics = spec.build(spec.reader.read(page), 1.0)
    assert (metrics.waiting, metrics.kv_cache_usage) == (3, 0.25)


async def test_the_provider_example_feeds_the_control_plane() -> None:
    from kvgate.gateway.controlplane.control_plane import ControlPlane, ControlPlaneSettings
    from kvgate.gateway.controlplane.xds import SnapshotCache
    from kvgate.gateway.picker.service import PickerService, PickerSettings
    from kvgate.gateway.up_options import bundled_example

    namespace = run(next(block for block in examples() if "StaticProvider" in block))
    text = "\n---\n".join(path.read_text() for path in sorted(bundled_example().glob("*.yaml")))
    provider = namespace["StaticProvider"](text)
    picker = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0))
    settings = ControlPlaneSettings(picker_address="127.0.0.1:9002")
    control = ControlPlane(provider, picker, SnapshotCache(), settings)
    assert control.apply(await provider.first()), control.last_error
    assert control.applied is not None
    assert control.applied.pools == ("default/llama",)
