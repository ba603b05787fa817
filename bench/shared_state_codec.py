"""Cost of the shared-state wire format: format 1 (protobuf, proto/kvgate_proto/shared_state.proto) against
format 0 (the hand-packed ``struct`` layout kvgate wrote before, still read).

``python -m kvgate.bench.shared_state_codec [--batches 2000] [--output bench/results/shared_state_codec.md]``

A batch as a busy picker flushes it: 64 prefix insertions of 32 block hashes each (a 2,000-token
prompt at 64 tokens a block) and 8 session pins. Encoding runs on the picker's flush (off the
request path), decoding on every peer for every batch. The format 0 encoder lives here only, to
compare against; the product reads format 0 (``decode_legacy_batch``) and writes format 1.
"""

from __future__ import annotations

import argparse
import platform
import random
import struct
import sys
import timeit
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvgate.gateway.picker.shared_state.codec import (
    PrefixInsert,
    SessionPin,
    SharedEvent,
    decode_batch,
    decode_legacy_batch,
    encode_batch,
)


def format0_encode(events: Iterable[SharedEvent]) -> bytes:
    """What kvgate wrote before proto/ (see ``decode_legacy_batch`` for the layout)."""
    out = bytearray()
    for event in events:
        if isinstance(event, PrefixInsert):
            address = event.address.encode()
            out += b"P" + struct.pack("<H", len(address)) + address
            out += struct.pack("<IH", event.capacity, len(event.hashes))
            out += struct.pack(f"<{len(event.hashes)}Q", *event.hashes)
        else:
            session, address = event.session_id.encode(), event.address.encode()
            out += b"S" + struct.pack("<H", len(session)) + session
            out += struct.pack("<H", len(address)) + address
    return bytes(out)


def sample_batch(seed: int = 1) -> list[SharedEvent]:
    rng = random.Random(seed)
    events: list[SharedEvent] = [
        PrefixInsert(f"10.0.{i % 16}.1:8000", tuple(rng.getrandbits(64) for _ in range(32)), 4096)
        for i in range(64)
    ]
    events += [SessionPin(f"session-{i}", "10.0.3.1:8000") for i in range(8)]
    return events


def run(batches: int) -> str:
    events = sample_batch()
    old, new = format0_encode(events), encode_batch(events)
    if decode_legacy_batch(old) != decode_batch(new) or decode_batch(new) != events:
        raise RuntimeError("the two formats do not carry the same events")
    timings = {
        "encode": (timeit.timeit(lambda: format0_encode(events), number=batches) / batches,
                   timeit.timeit(lambda: encode_batch(events), number=batches) / batches),
        "decode": (timeit.timeit(lambda: decode_legacy_batch(old), number=batches) / batches,
                   timeit.timeit(lambda: decode_batch(new), number=batches) / batches),
    }
    lines = [
        "# Shared-state wire format: protobuf (format 1) against struct (format 0)", "",
        f"- command: `python -m kvgate.bench.shared_state_codec {' '.join(sys.argv[1:])}`",
        f"- machine: {platform.machine()}, Python {platform.python_version()}; one batch = 64 prefix "
        f"insertions of 32 hashes + 8 session pins; {batches} batches each way, one run", "",
        "| | format 0 (struct) | format 1 (protobuf) | 1 / 0 |", "|---|---|---|---|",
        f"| bytes per batch | {len(old):,} | {len(new):,} | {len(new) / len(old):.2f} |",
    ]
    for name, (before, after) in timings.items():
        ratio = after / before
        lines.append(f"| {name}, µs per batch | {before * 1e6:.1f} | {after * 1e6:.1f} | {ratio:.2f} |")
    per_event = timings["decode"][1] * 1e6 / len(events)
    lines += ["", f"- format 1 decode: {per_event:.2f} µs per event on each peer", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.shared_state_codec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = run(args.batches)
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
