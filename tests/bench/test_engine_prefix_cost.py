"""bench/engine_prefix_cost.py runs its measurement (a few requests; no timing asserted)."""

from __future__ import annotations

from kvgate.bench.engine_prefix_cost import TOKENIZER, run
from kvgate.policies.plugins.engine_prefix import EnginePrefixBlueprint


def test_it_times_one_prepare_per_request() -> None:
    blueprint = EnginePrefixBlueprint.from_parameters({"tokenizer": str(TOKENIZER)})
    times = run(256, 4, 2, blueprint)
    assert len(times) == 4
    assert all(t > 0 for t in times)


def test_the_media_variant_matches_past_each_groups_image() -> None:
    """``--media``: chats with a named image; the held blocks (up to the question) are matched."""
    from kvgate.bench.engine_prefix_cost import IMAGE
    from kvgate.policies.engine_blocks import EngineBlockIndex

    image = {"placeholder": IMAGE.placeholder, "tokens": IMAGE.tokens, "token_id": IMAGE.token_id}
    blueprint = EnginePrefixBlueprint.from_parameters({"tokenizer": str(TOKENIZER.parent),
                                                       "media": {"image": image}})
    times = run(512, 4, 2, blueprint, media=True)
    assert len(times) == 4
    from kvgate.bench.engine_prefix_cost import store_chat
    index = EngineBlockIndex()
    assert blueprint.model is not None
    store_chat(index, blueprint.model, "the and for are " * 30, 0, ["a"])
    assert index.blocks("a") > 64 // 16  # past the image's 64 tokens
