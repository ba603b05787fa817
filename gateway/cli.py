"""The ``kvgate`` command: one entry point, subcommands dispatched to their owners.

``kvgate sim`` hands its arguments to the simulator's own CLI (the simulator is an outsider that
imports nothing of ours; importing it here, lazily, is the only edge towards it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

SubcommandMain = Callable[[Sequence[str]], int]


def _run_sim(argv: Sequence[str]) -> int:
    from simulator.cli import main as sim_main

    return sim_main(argv)


def _run_picker(argv: Sequence[str]) -> int:
    from gateway.picker_cli import main as picker_main

    return picker_main(argv)


def _run_bench(argv: Sequence[str]) -> int:
    from bench.routing import main as bench_main

    return bench_main(argv)


def _run_up(argv: Sequence[str]) -> int:
    from gateway.up import main as up_main

    return up_main(argv)


def _run_status(argv: Sequence[str]) -> int:
    from gateway.status_cli import main as status_main

    return status_main(argv)


def _subcommands() -> dict[str, tuple[str, SubcommandMain]]:
    return {
        "up": ("run Envoy + control plane + picker (and a simulated fleet) in one command", _run_up),
        "status": ("show the resource conditions and xDS state of a running kvgate up", _run_status),
        "sim": ("run a simulated vLLM-compatible fleet", _run_sim),
        "picker": ("run the endpoint picker (ext_proc) for pools listed in a file", _run_picker),
        "bench": ("run the routing-quality benchmark (bench/, needs a source checkout)", _run_bench),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = _subcommands()
    parser = argparse.ArgumentParser(
        prog="kvgate",
        description="kvgate: a KV-cache, prefix and LoRA aware inference gateway on Envoy.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, _) in commands.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not args or args[0] not in commands:
        parser.parse_args(args or ["--help"])
        return 2
    _, run = commands[args[0]]
    return run(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
