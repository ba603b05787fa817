"""The first-token time disaggregation cannot beat, on an idle fleet: P/D against aggregated serving
for one prompt at a time, from the simulator's own engine model (no load, no routing, no sockets).

Run: ``python -m kvgate.bench.pd_floor`` (seconds; ``--output bench/results/pd-floor.md``).

Aggregated: the prompt on an idle replica, its first token. Disaggregated: the same prompt on an
idle prefill instance (``max_tokens`` 1, its KV held), the transfer of its whole blocks
(``simulator.kv_transfer.KvTransferSettings.transfer_time``: latency + bytes / bandwidth), then the
decode instance's first token (it computes what was not transferred: the last partial block and at
least the prompt's last token, as vLLM does). The ratio is P/D's TTFT over aggregated serving's for
that prompt with nothing queued anywhere: what the KV transfer and the extra step alone cost. Under
load P/D gains back only what aggregated serving loses to queueing and to decodes sharing its steps;
a TTFT target below this ratio cannot be met by routing (bench/results/pd.md).
"""

from __future__ import annotations

import argparse
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.simulator.engine import Engine
from kvgate.simulator.engine_types import EngineConfig, FirstToken, SimRequest
from kvgate.simulator.kv_transfer import KvTransferSettings
from kvgate.simulator.profiles import load_profile

PROFILE = "blis-llama-3.1-8b-h100"
LENGTHS = (1024, 2048, 4096, 8192, 10240, 12288, 14336, 16384)
BANDWIDTHS_GBS = (25.0, 40.0, 50.0, 100.0, 200.0, 400.0)


@dataclass(frozen=True, slots=True)
class Floor:
    tokens: int
    aggregated_s: float
    prefill_s: float
    transfer_s: float
    decode_s: float

    @property
    def disaggregated_s(self) -> float:
        return self.prefill_s + self.transfer_s + self.decode_s

    @property
    def ratio(self) -> float:
        return self.disaggregated_s / self.aggregated_s


def first_token_s(request: SimRequest, config: EngineConfig) -> float:
    """When an idle engine makes ``request``'s first token."""
    engine = Engine(config, load_profile(PROFILE))
    engine.submit(request, 0.0)
    now = 0.0
    while (duration := engine.begin_step(now)) is not None:
        now += duration
        for event in engine.end_step(now):
            if isinstance(event, FirstToken) and event.request_id == request.request_id:
                return event.time
    raise RuntimeError("the engine finished without a first token")


def floor(tokens: int, transfer: KvTransferSettings, config: EngineConfig) -> Floor:
    prompt = tuple(range(1, tokens + 1))
    blocks = tokens // config.block_size
    received = blocks * config.block_size
    return Floor(
        tokens,
        aggregated_s=first_token_s(SimRequest("agg", prompt, 1), config),
        prefill_s=first_token_s(SimRequest("prefill", prompt, 1, hold_kv=True), config),
        transfer_s=transfer.transfer_time(blocks, config.block_size),
        decode_s=first_token_s(SimRequest("decode", prompt, 1, remote_tokens=received), config),
    )


def report(lengths: Sequence[int], bandwidths: Sequence[float]) -> str:
    config = EngineConfig()
    base = KvTransferSettings()
    at_default = [floor(n, base, config) for n in lengths]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip() or "?"
    lines = [
        "# The P/D first-token floor: disaggregated against aggregated serving on an idle fleet",
        "",
        f"- Command: `python -m kvgate.bench.pd_floor` at {commit}, {platform.machine()}, Python "
        f"{platform.python_version()} (a model calculation: the figures depend on no machine).",
        f"- The simulator's engine model ({PROFILE}, EngineConfig defaults: max_num_batched_tokens "
        f"{config.max_num_batched_tokens}, block size {config.block_size}) and its KV transfer "
        f"(latency {base.latency_s * 1000:.0f} ms, {base.kv_bytes_per_token:,} bytes a token); one "
        "prompt at a time, nothing queued (bench/pd_floor.py says what is timed).",
        "",
        f"## At the simulator's default fabric ({base.bandwidth_gbs:.0f} GB/s)",
        "",
        "| prompt tokens | aggregated TTFT ms | P/D: prefill ms | transfer ms | decode's first token ms "
        "| P/D TTFT ms | P/D / aggregated |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in at_default:
        ms = [x * 1000 for x in (f.aggregated_s, f.prefill_s, f.transfer_s, f.decode_s, f.disaggregated_s)]
        lines.append(f"| {f.tokens:,} | " + " | ".join(f"{x:.1f}" for x in ms) + f" | **{f.ratio:.3f}** |")
    lines += [
        "",
        "## P/D / aggregated TTFT by fabric bandwidth (GB/s per GPU)",
        "",
        "| prompt tokens | " + " | ".join(f"{b:g}" for b in bandwidths) + " |",
        "|---|" + "---|" * len(bandwidths),
    ]
    for n in lengths:
        ratios = [floor(n, KvTransferSettings(bandwidth_gbs=b), config).ratio for b in bandwidths]
        lines.append(f"| {n:,} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=None, help="write the page here (else stdout)")
    args = parser.parse_args(argv)
    page = report(LENGTHS, BANDWIDTHS_GBS)
    if args.output is None:
        print(page, end="")
    else:
        args.output.write_text(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
