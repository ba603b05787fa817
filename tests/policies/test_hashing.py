from __future__ import annotations

import struct

import pytest
import xxhash

from kvgate.policies.hashing import PromptHasher
from tests.policies.helpers import text


@pytest.mark.parametrize("scheme", ["chained-xor", "gie"])
def test_blocks_cover_whole_blocks_up_to_max(scheme: str) -> None:
    hasher = PromptHasher(64, 256, scheme)  # type: ignore[arg-type]
    assert hasher.hashes("m", "x" * 63) == ()
    assert len(hasher.hashes("m", "x" * 64)) == 1
    assert len(hasher.hashes("m", "x" * 130)) == 2
    assert len(hasher.hashes("m", text(1, 40_000))) == 256


@pytest.mark.parametrize("scheme", ["chained-xor", "gie"])
def test_hash_names_the_prefix_model_and_salt(scheme: str) -> None:
    hasher = PromptHasher(64, 256, scheme)  # type: ignore[arg-type]
    a = text(1, 640)
    b = a[:320] + text(2, 320)
    ha, hb = hasher.hashes("m", a), hasher.hashes("m", b)
    assert ha[:5] == hb[:5]
    assert all(x != y for x, y in zip(ha[5:], hb[5:], strict=True))
    assert hasher.hashes("other", a)[0] != ha[0]
    assert hasher.hashes("m", a, "salt")[0] != ha[0]
    # a block equal in content but after a different prefix hashes differently (chaining)
    assert hasher.hashes("m", "A" * 64 + "B" * 64)[1] != hasher.hashes("m", "C" * 64 + "B" * 64)[1]


def test_gie_scheme_is_gies_bytes() -> None:
    prompt = text(3, 200)
    seed = xxhash.xxh64_intdigest(b"model" + b"salt")
    h1 = xxhash.xxh64_intdigest(prompt[:64].encode() + struct.pack("<Q", seed))
    h2 = xxhash.xxh64_intdigest(prompt[64:128].encode() + struct.pack("<Q", h1))
    assert PromptHasher(64, 256, "gie").hashes("model", prompt, "salt")[:2] == (h1, h2)
