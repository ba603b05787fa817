"""``engine-prefix-matches`` (``policies.plugins.engine_prefix``): the engines' reported blocks
replace the approximate index's guess for the endpoints whose events are followed."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from kvgate.policies.engine_blocks import EngineBlockIndex, block_keys
from kvgate.policies.errors import ConfigError
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.profile import build_profile, read_profile_document
from kvgate.policies.scheduler import ProfileScheduler
from tests.policies.helpers import NOW, request, view

WORDS = [f"w{i}" for i in range(200)]


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> Path:
    """A real tokenizer.json (word level: one token per word, ids by position)."""
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", *WORDS])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


class View:
    """The picker's view of one pool's engine-reported blocks, in step where said."""

    def __init__(self, index: EngineBlockIndex, in_step: set[str],
                 model: ModelTokenizer | None = None) -> None:
        self.index = index
        self.followed = in_step
        self.model = model
        self.checks: list[tuple[str, bool, bool]] = []

    def matches(self, keys: Sequence[int]) -> Mapping[str, int]:
        return self.index.matches(keys)

    def in_step(self, endpoint: str) -> bool:
        return endpoint in self.followed

    def knows_adapter(self, name: str) -> bool:
        return self.index.knows_adapter(name)

    def held(self, key: int) -> bool:
        return self.index.held(key)

    def tokenizer(self) -> ModelTokenizer | None:
        return self.model

    def block_size(self) -> int | None:
        return self.index.block_size

    def key_checked(self, endpoint: str, *, held: bool, trusted: bool) -> None:
        self.checks.append((endpoint, held, trusted))


def scheduler(tokenizer_file: Path | None, cache: View) -> ProfileScheduler:
    """The default profile (which has engine-prefix-matches), its tokenizer ``tokenizer_file`` (None:
    the pool's, from the view)."""
    document = dict(read_profile_document("default"))
    if tokenizer_file is not None:
        document["plugins"] = [
            {**plugin, "parameters": {"tokenizer": str(tokenizer_file)}}
            if plugin["type"] == "engine-prefix-matches" else plugin for plugin in document["plugins"]]
    return ProfileScheduler(build_profile(yaml.safe_load(yaml.safe_dump(document))), rng=random.Random(1),
                            engine_cache=cache)


def ids(text: str) -> list[int]:
    return [WORDS.index(w) + 1 for w in text.split()]


def test_the_engines_report_decides_for_followed_endpoints(tokenizer_file: Path) -> None:
    document = " ".join(WORDS[:128])  # 128 tokens: 8 engine blocks; ~700 characters: 2 index blocks
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(8)), None, ids(document), 16)
    s = scheduler(tokenizer_file, View(index, {a.address, b.address}))
    result = s.schedule(request("r", document + " w199"), [a, b, view(3)], NOW)
    assert result.pick.address == a.address  # the engine holds it there, and nothing told kvgate so
    assert result.predicted_cached_tokens == 128 // 64 * 64  # 128 reported tokens in 64-token units
    # endpoint 2's events are followed and report nothing: a guess from the approximate index that it
    # holds the document (kvgate sent it there) gives way to the report
    s.on_picked(request("warm", document), b.endpoint, NOW)
    again = s.schedule(request("r2", document + " w198"), [a, b], NOW)
    assert again.pick.address == a.address


def test_an_endpoint_not_followed_keeps_the_approximate_guess(tokenizer_file: Path) -> None:
    document = " ".join(WORDS[:128])
    a, b = view(1), view(2)
    s = scheduler(tokenizer_file, View(EngineBlockIndex(), set()))  # nothing followed
    s.on_picked(request("warm", document), b.endpoint, NOW)
    result = s.schedule(request("r", document + " w199"), [a, b], NOW)
    assert result.pick.address == b.address  # the approximate index's affinity, as without events


def test_blocks_stored_under_an_adapter_match_that_adapters_requests_only(tokenizer_file: Path) -> None:
    document = " ".join(WORDS[:64])
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, [1, 2, 3, 4], None, ids(document), 16, lora="sql-lora")
    s = scheduler(tokenizer_file, View(index, {a.address, b.address}))
    lora = request("r", document + " w199", model="sql-lora")
    assert s.schedule(lora, [a, b], NOW).predicted_cached_tokens == 64
    base = request("r2", document + " w199")
    assert s.schedule(base, [a, b], NOW).predicted_cached_tokens == 0


def test_a_tokenizer_that_cannot_be_loaded_is_a_config_error(tmp_path: Path) -> None:
    from kvgate.policies.plugins.engine_prefix import EnginePrefixBlueprint

    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        EnginePrefixBlueprint.from_parameters({"tokenizer": str(tmp_path / "bad.json")})
    assert block_keys([1, 2], 16) == []


def test_chunked_tokenization_equals_the_whole_texts_and_reuses_shared_prefixes() -> None:
    """On the repository's byte-level BPE tokenizer: the chunks' ids joined are the whole text's, for
    texts with punctuation, double spaces, newlines and long words; a second prompt sharing the
    first's prefix tokenizes only what follows it."""
    from kvgate.policies.chunked_tokenizer import ChunkedTokenizer

    path = Path(__file__).resolve().parents[2] / "simulator" / "data" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    chunked = ChunkedTokenizer(tokenizer, chunk_chars=128)
    rng = random.Random(5)
    pieces = ["harbour", "ledger,", "ship.", "  cargo", "\nnorth", "river:", "a" * 300, "grain", "é", "—"]
    for _ in range(40):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 120)))
        assert chunked.encode(text) == tokenizer.encode(text, add_special_tokens=True).ids, text
    calls: list[str] = []
    real = tokenizer.encode

    class Counting:
        def encode(self, text: str, add_special_tokens: bool = True) -> object:
            calls.append(text)
            return real(text, add_special_tokens=add_special_tokens)

    counted = ChunkedTokenizer(Counting(), chunk_chars=128)  # type: ignore[arg-type]
    document = " ".join(["harbour ledger ship cargo"] * 40)
    counted.encode(document + " first question")
    calls.clear()
    counted.encode(document + " second question")
    assert sum(len(c) for c in calls) < 200  # the document's chunks came from memory


def test_keys_by_remembered_chunks_equal_the_keys_of_the_whole_texts_tokens() -> None:
    """``ChunkedTokenizer.keys``: the same keys as ``block_keys`` over the whole text's ids, for any
    chunking, root (adapter, salt) and block size, memo warm or cold."""
    from kvgate.policies.chunked_tokenizer import ChunkedTokenizer
    from kvgate.policies.engine_blocks import chain_root

    path = Path(__file__).resolve().parents[2] / "simulator" / "data" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    chunked = ChunkedTokenizer(tokenizer, chunk_chars=96)
    rng = random.Random(9)
    pieces = ["harbour", "ledger,", "ship.", "cargo", "north", "river:", "grain", "é", "—", "anchor"]
    shared = " ".join(rng.choice(pieces) for _ in range(150))
    for i in range(30):
        text = shared + " " + " ".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        text = text if i % 3 else " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        lora, salt = (("sql-lora", None), (None, "tenant"), (None, None))[i % 3]
        for size in (16, 7):
            want = block_keys(tokenizer.encode(text, add_special_tokens=True).ids, size, lora=lora, salt=salt)
            assert chunked.keys(text, size, chain_root(lora, salt)) == want


def test_without_a_profile_tokenizer_the_pools_is_used_and_without_either_nothing_changes(
    tokenizer_file: Path,
) -> None:
    document = " ".join(WORDS[:128])
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(8)), None, ids(document), 16)
    pools = scheduler(None, View(index, {a.address, b.address}, ModelTokenizer.load(tokenizer_file)))
    assert pools.schedule(request("r", document + " w199"), [a, b], NOW).pick.address == a.address
    neither = scheduler(None, View(index, {a.address, b.address}))  # the default profile, no tokenizer
    neither.on_picked(request("warm", document), b.endpoint, NOW)
    result = neither.schedule(request("r2", document + " w199"), [a, b], NOW)
    assert result.pick.address == b.address  # the approximate index's guess, as before events


def test_the_block_size_the_engines_report_is_the_one_keyed(tokenizer_file: Path) -> None:
    document = " ".join(WORDS[:128])
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(4)), None, ids(document), 32)  # an engine with 32-token blocks
    s = scheduler(None, View(index, {a.address, b.address}, ModelTokenizer.load(tokenizer_file)))
    result = s.schedule(request("r", document + " w199"), [a, b], NOW)
    assert result.pick.address == a.address
    assert result.predicted_cached_tokens == 128


def test_a_chat_request_is_keyed_through_the_models_chat_template() -> None:
    """The repository's model directory (tokenizer.json and tokenizer_config.json's template): an
    engine that stored a conversation's rendered tokens draws its next turn, which a flattening of
    the messages could not match (the template puts its header tokens first)."""
    import dataclasses

    from kvgate.simulator.tokenizer import render_chat

    model = ModelTokenizer.load(Path(__file__).resolve().parents[2] / "simulator" / "data")
    history = [{"role": "system", "content": "the and for are but not you all " * 40},
               {"role": "user", "content": "can had her was one our out day " * 8},
               {"role": "assistant", "content": "get has him his how man new now " * 8}]
    rendered = render_chat(history).removesuffix("<|start_header_id|>assistant<|end_header_id|>\n\n")
    tokens = model.tokenizer.encode(rendered, add_special_tokens=False).ids
    whole = len(tokens) - len(tokens) % 16
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(whole // 16)), None, tokens[:whole], 16)
    s = scheduler(None, View(index, {a.address, b.address}, model))
    messages = [*history, {"role": "user", "content": "old see two way who boy did its"}]
    chat = dataclasses.replace(request("r", "flattened messages"), messages=messages)
    result = s.schedule(chat, [a, b], NOW)
    assert result.pick.address == a.address
    assert (result.predicted_cached_tokens or 0) >= whole // 64 * 64 - 64


def test_a_request_in_flight_holds_its_prefix_until_the_engine_reports_it(tokenizer_file: Path) -> None:
    """Picked but not yet reported (its prefill still running): the requests for the same document
    follow it; once it ends, only the engines' report counts (here: nothing)."""
    document = " ".join(WORDS[:128])
    a, b, c = view(1), view(2), view(3)
    s = scheduler(tokenizer_file, View(EngineBlockIndex(), {a.address, b.address, c.address}))
    first = request("r1", document + " w199")
    picked = s.schedule(first, [a, b, c], NOW).pick
    s.on_picked(first, picked, NOW)
    for i in range(6):  # without the pending blocks: a third of them each
        follower = s.schedule(request(f"f{i}", document + f" w{190 - i}"), [a, b, c], NOW)
        assert follower.pick.address == picked.address
        assert follower.predicted_cached_tokens == 128
    s.on_finished(first, picked, ok=True, now=NOW)
    after = s.schedule(request("r3", document + " w150"), [a, b, c], NOW)
    assert after.predicted_cached_tokens == 0


def test_keys_asked_what_is_held_stop_after_the_held_run_and_are_a_prefix_of_the_whole_keys() -> None:
    """With ``held``: a prompt whose blocks are held up to some block is keyed at least that far
    and at most a piece further (its unshared tail is not tokenized; a prompt nobody holds, one
    piece); what was keyed piece by piece is remembered as the whole chunk's keys (a later call
    without ``held`` gives the whole text's keys)."""
    from kvgate.policies.chunked_tokenizer import ChunkedTokenizer
    from kvgate.policies.engine_blocks import chain_root

    path = Path(__file__).resolve().parents[2] / "simulator" / "data" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    rng = random.Random(3)
    pieces = ["harbour", "ledger,", "ship.", "cargo", "north", "river:", "grain", "anchor", "tide"]
    shared = " ".join(rng.choice(pieces) for _ in range(400))
    root = chain_root(None, None)
    for held_blocks in (0, 1, 37, 200, 10_000):
        chunked = ChunkedTokenizer(tokenizer, chunk_chars=256)
        text = shared + " " + " ".join(rng.choice(pieces) for _ in range(60))
        whole = block_keys(tokenizer.encode(text, add_special_tokens=True).ids, 16)
        held = set(whole[:held_blocks])
        got = chunked.keys(text, 16, root, held=held.__contains__)
        assert got == whole[:len(got)]
        if held_blocks >= len(whole):
            assert got == whole  # everything held
        else:
            assert held_blocks < len(got) <= held_blocks + 20  # a 64-character piece: < 20 blocks
        assert chunked.keys(text, 16, root) == whole  # the memo, whatever was keyed piece by piece


def test_a_prompt_sent_as_token_ids_is_keyed_as_they_are_without_a_tokenizer() -> None:
    """A client that tokenized the prompt itself: the engine adds nothing to the ids, so neither
    does the picker (no tokenizer needed); a batch of prompts is not predicted."""
    import dataclasses

    ids = list(range(40, 40 + 96))
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(6)), None, ids, 16)
    s = scheduler(None, View(index, {a.address, b.address}))  # no tokenizer anywhere
    as_ids = dataclasses.replace(request("r", " ".join(map(str, ids))), engine_prompt=(*ids, 7, 7))
    result = s.schedule(as_ids, [a, b], NOW)
    assert result.pick.address == a.address
    assert result.predicted_cached_tokens == 64
    batch = dataclasses.replace(request("r2", "a\nb"), engine_prompt=())
    assert s.schedule(batch, [a, b], NOW).predicted_cached_tokens == 0


def test_an_api_whose_prompt_the_engine_builds_otherwise_keeps_the_approximate_guess(
    tokenizer_file: Path,
) -> None:
    """A Responses API request (vLLM turns its items into chat messages): its flattened text is not
    what the engine tokenizes, so the followed endpoints' reports (nothing matching) must not replace
    the approximate index's guess (before: every in-step endpoint predicted 0 for such requests)."""
    import dataclasses

    from kvgate.policies.types import ApiKind

    document = " ".join(WORDS[:128])
    a, b = view(1), view(2)
    s = scheduler(tokenizer_file, View(EngineBlockIndex(), {a.address, b.address}))
    s.on_picked(request("warm", document), b.endpoint, NOW)
    s.on_finished(request("warm", document), b.endpoint, ok=True, now=NOW)
    responses = dataclasses.replace(request("r", document + " w199"), api=ApiKind.RESPONSES)
    guessed = s.schedule(responses, [a, b], NOW)
    assert guessed.pick.address == b.address
    assert (guessed.predicted_cached_tokens or 0) > 0
    completion = request("r2", document + " w198")  # keyed: the engines report nothing there
    assert s.schedule(completion, [a, b], NOW).predicted_cached_tokens == 0


def test_an_engine_holding_more_than_the_text_estimate_still_tells_endpoints_apart() -> None:
    """A prompt's text estimate (its characters / 4) can be shorter than what the engines report
    holding (a template's tools and headers, image tokens, a client's token ids): every endpoint
    holding at least the estimate looked fully cached, and the one holding more lost its edge. The
    plugins now count the prompt as at least what an endpoint holds (``ctx.prompt_tokens``)."""
    import dataclasses

    ids = list(range(500, 500 + 200))
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(12)), None, ids[:192], 16)
    index.stored(b.address, [100 + i for i in range(4)], None, ids[:64], 16)
    s = scheduler(None, View(index, {a.address, b.address}))
    for i in range(10):
        short_text = dataclasses.replace(request(f"r{i}", "a few words " * 4), engine_prompt=(*ids, i))
        assert s.schedule(short_text, [a, b], NOW).pick.address == a.address


def test_keys_the_engines_never_hold_give_way_to_the_approximate_guess_until_they_do(
    tokenizer_file: Path,
) -> None:
    """Engines that tokenize otherwise than kvgate's tokenizer (here: every id shifted by one) report
    blocks that kvgate's keys never match: each served request's check finds its last key missing,
    and past ``min_checks`` the pool's keys are not trusted: the approximate index decides (as for an
    endpoint not followed), the view is told. When the engines hold kvgate's keys again, they decide
    again."""
    rng = random.Random(3)
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    cache = View(index, {a.address, b.address})
    s = scheduler(tokenizer_file, cache)
    document = " ".join(WORDS[:128])
    index.stored(a.address, [f"doc{i}" for i in range(8)], None, ids(document), 16)
    s.on_picked(request("warm", document), b.endpoint, NOW)  # the approximate index's guess: b
    assert s.schedule(request("q0", document + " w199"), [a, b], NOW).pick.address == a.address
    now = NOW

    def serve(n: int, shift: int) -> None:
        for i in range(n):
            text = " ".join(rng.choice(WORDS) for _ in range(48))
            rid = f"served-{shift}-{i}"
            r = request(rid, text)
            s.schedule(r, [a, b], now)
            served = (a, b)[i % 2]
            s.on_picked(r, served.endpoint, now)
            tokens = [t + shift for t in ids(text)]
            index.stored(served.address, [f"{rid}-{k}" for k in range(3)], None, tokens, 16)
            s.on_finished(r, served.endpoint, ok=True, now=now)

    serve(40, shift=1)
    now += 2.0  # the checks are due
    assert s.schedule(request("q1", document + " w198"), [a, b], now).pick.address == b.address
    assert len(cache.checks) == 40
    assert not any(held for _, held, _ in cache.checks)
    assert cache.checks[-1][2] is False
    serve(40, shift=0)
    now += 2.0
    assert s.schedule(request("q2", document + " w197"), [a, b], now).pick.address == a.address
    assert cache.checks[-1] == (b.address, True, True)
