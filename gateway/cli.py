"""The ``kvgate`` command: one entry point, subcommands dispatched to their owners.

``kvgate sim`` hands its arguments to the simulator's own CLI (the simulator is an outsider that
imports nothing of ours; importing it here, lazily, is the only edge towards it).

Commands of packages on top of the product come in as plugins: an entry point in the
``kvgate.commands`` group names a ``main(argv) -> int`` (the benchmark's ``kvgate bench`` is one,
declared in pyproject.toml), so the product never imports them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points

SubcommandMain = Callable[[Sequence[str]], int]

PLUGIN_GROUP = "kvgate.commands"
_PLUGIN_HELP = {"bench": "run the routing-quality benchmark (its routers: pip install 'kvgate[bench]')"}


def _run_sim(argv: Sequence[str]) -> int:
    from kvgate.simulator.cli import main as sim_main

    return sim_main(argv)


def inference_extension_args(args: Sequence[str]) -> list[str] | None:
    """``kvgate``'s arguments for the Inference Extension picker's command line (its image's
    ``args``, as its and llm-d's charts give them, with no subcommand: kvgate's image in their
    place), or None for any other: ``picker --kubernetes``, bound to every interface as theirs is
    unless ``--host`` says otherwise."""
    if not args or not args[0].startswith("-"):
        return None
    if not _has_flag(args, "--pool-name", "--endpoint-selector"):
        return None
    host = [] if _has_flag(args, "--host") else ["--host", "0.0.0.0"]
    return ["picker", "--kubernetes", *host, *args]


def _has_flag(args: Sequence[str], *flags: str) -> bool:
    return any(a == flag or a.startswith(f"{flag}=") for a in args for flag in flags)


def _run_picker(argv: Sequence[str]) -> int:
    if _has_flag(argv, "--kubernetes", "--endpoint-selector"):  # following a cluster: both floors composed
        from kvgate.gateway.picker_kubernetes import main as cluster_main

        return cluster_main(argv)
    from kvgate.gateway.picker.cli import main as picker_main

    return picker_main(argv)


def _run_up(argv: Sequence[str]) -> int:
    from kvgate.gateway.up_cli import main as up_main

    return up_main(argv)


def _run_status(argv: Sequence[str]) -> int:
    from kvgate.gateway.controlplane.status_cli import main as status_main

    return status_main(argv)


def _subcommands() -> dict[str, tuple[str, SubcommandMain]]:
    return {
        "up": ("run Envoy + control plane + picker (and a simulated fleet) in one command", _run_up),
        "status": ("show the resource conditions and xDS state of a running kvgate up", _run_status),
        "sim": ("run a simulated vLLM-compatible fleet", _run_sim),
        "picker": ("run the endpoint picker (ext_proc) for pools listed in a file", _run_picker),
    }


def _plugin(entry: EntryPoint) -> SubcommandMain:
    def run(argv: Sequence[str]) -> int:
        command: SubcommandMain = entry.load()
        return command(argv)

    return run


def _commands() -> dict[str, tuple[str, SubcommandMain]]:
    commands = _subcommands()
    for entry in entry_points(group=PLUGIN_GROUP):
        if entry.name not in commands:
            help_text = _PLUGIN_HELP.get(entry.name, f"plugin command ({entry.value})")
            commands[entry.name] = (help_text, _plugin(entry))
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    # kvgate starts child processes (Envoy, the simulator, workers) by fork and exec while gRPC's
    # threads run; gRPC's fork handlers then print "Other threads are currently calling into gRPC,
    # skipping fork() handlers" at every start. No child uses its parent's gRPC, so they are off.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    args = list(sys.argv[1:] if argv is None else argv)
    args = inference_extension_args(args) or args
    commands = _commands()
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
