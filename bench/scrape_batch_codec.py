"""Cost of a shared-scrape batch's wire format: format 2 (msgpack rows, what kvgate writes) against
format 1 (the protobuf ``ScrapeBatch`` of proto/shared_state.proto, what it wrote before and still
reads).

``python -m kvgate.bench.scrape_batch_codec [--endpoints 250] [--batches 400] [--output FILE]``

A batch as one of four pickers sharing a 1,000-endpoint pool writes it each sync round: its share,
250 endpoints, each with a LoRA adapter and a served model name. Encoding runs on the writer once
per round; decoding on every other picker for every batch (issue 35: with N pickers each reads
N - 1 batches a round). The format 1 encoder lives here only, to compare against.
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit
from collections.abc import Callable, Iterable
from pathlib import Path

from kvgate.gateway.picker.shared_state.scrapes import _U32_MAX, decode_scrapes, encode_scrapes
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView
from kvgate.proto import shared_state_pb2 as pb


def _u32(value: int) -> int:
    return max(0, min(int(value), _U32_MAX))


def encode_scrapes_format1(views: Iterable[EndpointView], now: float) -> bytes:
    """Format 1 (a ``ScrapeBatch``), as kvgate wrote it before format 2 (the product still reads
    it, for a rolling upgrade)."""
    batch = pb.ScrapeBatch(format=1)
    for view in views:
        entry = batch.endpoints.add(address=view.address, healthy=view.healthy)
        m = view.metrics
        if m is None:
            continue
        entry.age_ms = min(_U32_MAX, max(0, round((now - m.updated_at) * 1000)))
        out = entry.metrics
        out.waiting = _u32(m.waiting)
        out.running = _u32(m.running)
        out.kv_cache_usage = m.kv_cache_usage
        out.active_loras.extend(sorted(m.active_loras))
        out.waiting_loras.extend(sorted(m.waiting_loras))
        out.max_loras = _u32(m.max_loras)
        if m.block_size is not None:
            out.block_size = _u32(m.block_size)
        if m.num_gpu_blocks is not None:
            out.num_gpu_blocks = _u32(m.num_gpu_blocks)
        out.served_models.extend(sorted(m.served_models))
        out.running_unreported = not m.running_reported
    return batch.SerializeToString()



def views(endpoints: int) -> list[EndpointView]:
    return [EndpointView(Endpoint(f"10.0.{i // 250}.{i % 250}:8000", "p"), EndpointMetrics(
        waiting=i % 7, running=30, kv_cache_usage=0.5, active_loras=frozenset({"sql-lora"}), max_loras=4,
        block_size=16, num_gpu_blocks=9000, updated_at=99.9,
        served_models=frozenset({"meta-llama/Llama-3.1-8B-Instruct"}))) for i in range(endpoints)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.scrape_batch_codec",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--endpoints", type=int, default=250)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    batch = views(args.endpoints)
    reference = [r.metrics for r in decode_scrapes(encode_scrapes_format1(batch, 100.0), 100.0)]
    command = " ".join(sys.argv[1:] if argv is None else argv)
    lines = ["# Shared-scrape batches: format 2 (msgpack) against format 1 (protobuf)", "",
             f"`python -m kvgate.bench.scrape_batch_codec {command}`",
             "", f"Machine: {platform.machine()}, Python {platform.python_version()}. A batch of "
             f"{args.endpoints} endpoints; best of 3 runs of {args.batches} batches.", "",
             "| format | encode µs per endpoint | decode µs per endpoint | bytes per endpoint |",
             "|---|---|---|---|"]
    encoders: list[tuple[str, Callable[[Iterable[EndpointView], float], bytes]]] = [
        ("1 (protobuf)", encode_scrapes_format1), ("2 (msgpack)", encode_scrapes)]
    per = args.batches * args.endpoints
    for name, encode in encoders:
        data = encode(batch, 100.0)
        assert [r.metrics for r in decode_scrapes(data, 100.0)] == reference  # the same records

        def write(encode: Callable[[Iterable[EndpointView], float], bytes] = encode) -> bytes:
            return encode(batch, 100.0)

        def read(data: bytes = data) -> object:
            return decode_scrapes(data, 100.0)

        enc = min(timeit.repeat(write, number=args.batches, repeat=3)) / per
        dec = min(timeit.repeat(read, number=args.batches, repeat=3)) / per
        lines.append(f"| {name} | {enc * 1e6:.2f} | {dec * 1e6:.2f} | {len(data) / args.endpoints:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output is not None:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
