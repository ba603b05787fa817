"""What an idle picker costs: one ``kvgate picker`` scraping live endpoints, no traffic, CPU per second.

``python -m kvgate.bench.idle_picker [--endpoints 8] [--seconds 8] [--rounds 3] [--baseline DIR]
[--output FILE]``

One upstream process (``bench.datapath.upstream``: ``--endpoints`` ports with the data-path
benchmark's vLLM metrics page) and one picker at a time over it, at the default scrape interval
(50 ms: 20 scrapes a second per endpoint). For each picker: its process's cores over ``--seconds``
after a 2 s settle, and the upstream's (the scraped side). With ``--baseline DIR`` (another checkout
of kvgate, e.g. ``git worktree add /tmp/before HEAD~1``) the picker of that checkout runs too,
alternated with this one's round by round, so that the two are compared within one run; ratios
are of the medians. An idle picker's CPU is paid under load as well, spread over the requests
served (``bench.datapath.onepass``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvgate.bench.datapath.full_duplex import load_average, machine
from kvgate.bench.datapath.procs import Child, cpu_seconds, pools_yaml, start_picker, start_upstream

SETTLE_S = 2.0
HERE = Path(__file__).resolve().parent.parent


@dataclass
class Variant:
    name: str
    root: Path
    """The checkout whose ``gateway.cli`` runs (its directory goes first on PYTHONPATH)."""
    picker: list[float] = field(default_factory=list)
    upstream: list[float] = field(default_factory=list)


async def measure(variant: Variant, pools: Path, upstream: Child, seconds: float, log: Path) -> None:
    """One idle picker of ``variant`` for ``seconds``: its cores and the upstream's, appended."""
    child, _, _ = await start_picker(variant.name, pools, log, root=variant.root)
    try:
        await asyncio.sleep(SETTLE_S)
        picker_before, upstream_before = cpu_seconds(child.pid), cpu_seconds(upstream.pid)
        started = time.monotonic()
        await asyncio.sleep(seconds)
        wall = time.monotonic() - started
        variant.picker.append((cpu_seconds(child.pid) - picker_before) / wall)
        variant.upstream.append((cpu_seconds(upstream.pid) - upstream_before) / wall)
    finally:
        await child.stop()


async def run(args: argparse.Namespace) -> tuple[list[Variant], dict[str, str]]:
    here = Variant("this checkout", HERE)
    variants = [here]
    if args.baseline is not None:
        variants.insert(0, Variant(f"baseline ({args.baseline})", args.baseline))
    header = {
        "command": " ".join(["python -m kvgate.bench.idle_picker", *sys.argv[1:]]),
        **{f"machine {k}": v for k, v in machine().items()},
        "python": sys.version.split()[0],
    }
    upstream, endpoints = await start_upstream(args.endpoints)
    try:
        with tempfile.TemporaryDirectory(prefix="kvgate-idle-") as tmp:
            pools = Path(tmp) / "pools.yaml"
            pools.write_text(pools_yaml(endpoints, "bench", "default"))
            for round_index in range(args.rounds):
                for variant in variants:
                    log = Path(tmp) / f"picker-{round_index}.log"
                    await measure(variant, pools, upstream, args.seconds, log)
                    print(f"round {round_index + 1} {variant.name}: picker {variant.picker[-1]:.3f} "
                          f"upstream {variant.upstream[-1]:.3f}", file=sys.stderr, flush=True)
    finally:
        await upstream.stop()
    header["load after"] = load_average()
    return variants, header


def render(variants: Sequence[Variant], header: dict[str, str], endpoints: int) -> str:
    out = ["# An idle picker's CPU (scraping only)", ""]
    out += [f"- {key}: {value}" for key, value in header.items()]
    out += ["", f"{endpoints} endpoints, 20 scrapes a second each; cores (1.00 = one core busy), "
            "rounds in order, alternated between the checkouts.", "",
            "| picker | picker cores (rounds) | median | × first | upstream cores (rounds) | median "
            "| × first |",
            "|---|---|---|---|---|---|---|"]
    first = variants[0]
    for variant in variants:
        picker, upstream = statistics.median(variant.picker), statistics.median(variant.upstream)
        out.append(
            f"| {variant.name} | {', '.join(f'{c:.3f}' for c in variant.picker)} | {picker:.3f} | "
            f"{picker / statistics.median(first.picker):.2f} | "
            f"{', '.join(f'{c:.3f}' for c in variant.upstream)} | {upstream:.3f} | "
            f"{upstream / statistics.median(first.upstream):.2f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.idle_picker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per picker")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="another kvgate checkout to run alternately (e.g. a git worktree)")
    parser.add_argument("--output", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    variants, header = asyncio.run(run(args))
    text = render(variants, header, args.endpoints)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)


if __name__ == "__main__":
    main()
