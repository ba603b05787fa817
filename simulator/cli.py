"""``kvgate sim`` / ``python -m kvgate.simulator``: serve a simulated vLLM fleet until SIGINT or SIGTERM.

Example: ``kvgate sim --replicas 4 --port 8000 --loras sql,chat --max-loras 1 --time-scale 0.1
--replica 3:num_gpu_blocks=2048,slowdown=1.5 --admin-port 8100``.

Disaggregated fleets: ``--role prefill|decode|both`` gives every replica a role; ``--prefill N
--decode M`` (with ``--replicas K`` for K more of role ``both``) starts N prefill replicas, then M
decode replicas, then K; the KV transfer between them is modelled by ``--kv-bandwidth-gbs``,
``--kv-latency-ms`` and ``--kv-bytes-per-token`` (``simulator.kv_transfer``, docs/simulator.md).

Per-replica overrides (``--replica I:KEY=VALUE,…``, repeatable) accept the engine keys
``max_loras, max_num_seqs, max_num_batched_tokens, num_gpu_blocks, block_size, slowdown,
lora_load_time, enable_prefix_caching, loras`` (``loras`` separated by ``+``), ``profile``, and the
fault keys ``error_rate, metrics_delay_s, metrics_frozen, hang``.

Prints the ready protocol of :mod:`simulator.fleet` on stdout; exits 0 after a clean stop, 1 when a
listener cannot bind, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvgate.simulator.engine import EngineConfig
from kvgate.simulator.faults import FAULT_FIELDS, Faults
from kvgate.simulator.fleet import Fleet, FleetConfig, run_until
from kvgate.simulator.kv_transfer import ROLES, KvTransferSettings, Role
from kvgate.simulator.media import DEFAULT_IMAGE_TOKENS, ImageGrid
from kvgate.simulator.metrics import DIALECTS
from kvgate.simulator.server import ReplicaConfig

DEFAULT_PROFILE = "blis-llama-3.1-8b-h100"
_ENGINE_INT_KEYS = ("max_loras", "max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "block_size")
_ENGINE_FLOAT_KEYS = ("slowdown", "lora_load_time")


def build_parser() -> argparse.ArgumentParser:
    defaults = EngineConfig()
    p = argparse.ArgumentParser(prog="kvgate sim", description="Serve a simulated vLLM-compatible fleet.")
    kv = KvTransferSettings()
    p.add_argument("--replicas", type=int, default=None,
                   help="number of replicas (default 1; with --prefill/--decode: more of role both, "
                        "default 0)")
    p.add_argument("--role", choices=ROLES, default="both",
                   help="every replica's role when --prefill/--decode are not given (default both)")
    p.add_argument("--prefill", type=int, default=0, metavar="N", help="N replicas of role prefill")
    p.add_argument("--decode", type=int, default=0, metavar="M", help="M replicas of role decode")
    p.add_argument("--kv-bandwidth-gbs", type=float, default=kv.bandwidth_gbs,
                   help=f"KV transfer bandwidth, GB/s (default {kv.bandwidth_gbs:g})")
    p.add_argument("--kv-latency-ms", type=float, default=kv.latency_s * 1000,
                   help=f"fixed cost of one KV transfer, ms (default {kv.latency_s * 1000:g})")
    p.add_argument("--kv-bytes-per-token", type=int, default=kv.kv_bytes_per_token,
                   help=f"KV bytes per token (default {kv.kv_bytes_per_token}: Llama-3.1-8B, bf16)")
    p.add_argument("--kv-hold-timeout", type=float, default=kv.hold_timeout_s, metavar="SECONDS",
                   help="simulated seconds a prefill keeps KV no decode has read "
                        f"(default {kv.hold_timeout_s:g}, vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
    p.add_argument("--port", type=int, default=8000,
                   help="first port; replica i listens on port+i (0: ephemeral ports)")
    p.add_argument("--host", default="127.0.0.1", help="listen address when --hosts-from is not given")
    p.add_argument("--ssl-certfile", default=None, metavar="FILE",
                   help="serve HTTPS with this certificate (PEM; vLLM's flag): inference and /metrics")
    p.add_argument("--ssl-keyfile", default=None, metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument("--hosts-from", default=None, metavar="IP",
                   help="give replica i the address IP+i, all on --port (e.g. 127.0.1.1)")
    p.add_argument("--tokenizer", default=None, metavar="FILE",
                   help="tokenize with this tokenizer.json (e.g. the repository's "
                   "simulator/data/tokenizer.json) instead of the simulator's 4-characters rule")
    p.add_argument("--image-tokens", type=int, default=DEFAULT_IMAGE_TOKENS, metavar="N",
                   help=f"placeholder tokens per image in a chat (default {DEFAULT_IMAGE_TOKENS}; "
                   "LLaVA-1.5: 576)")
    p.add_argument("--image-grid", action="store_true",
                   help="images take Qwen2-VL's count instead: from each image's size (read from its data: "
                   "URL's header), 28-pixel cells within 3,136-12,845,056 pixels, a token per cell")
    p.add_argument("--kv-events-port", type=int, default=None, metavar="P",
                   help="publish vLLM's KV-cache events (ZMQ PUB on P, replay ROUTER on P+1; with "
                   "--hosts-from each replica on its own address, else replica i on P+2i); default: off")
    p.add_argument("--kv-events-connect", default=None, metavar="ADDRESS",
                   help="with --kv-events-port: the publishers connect to this ZMQ address (a picker's "
                   "bound socket, topic kv@<replica ip>@<model>) instead of binding P; replay stays on P+1")
    p.add_argument("--model", default=defaults.model)
    p.add_argument("--loras", default="", help="adapters the replicas serve: NAME,NAME,...")
    p.add_argument("--max-loras", type=int, default=defaults.max_loras)
    p.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    p.add_argument("--num-gpu-blocks", type=int, default=defaults.num_gpu_blocks)
    p.add_argument("--block-size", type=int, default=defaults.block_size)
    p.add_argument("--lora-load-time", type=float, default=defaults.lora_load_time,
                   help="simulated seconds to load an adapter into a slot")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--engine", choices=DIALECTS, default="vllm", help="metric names to expose")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="latency profile name or JSON path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="real seconds per simulated second (0.1: ten times faster than real)")
    p.add_argument("--slowdown", type=float, default=1.0, help="step-time multiplier for every replica")
    p.add_argument("--error-rate", type=float, default=0.0, help="fraction of requests answered 500")
    p.add_argument("--stream-interval", type=int, default=1, metavar="TOKENS",
                   help="tokens per SSE chunk of a streamed response (default 1: one chunk per token)")
    p.add_argument("--admin-port", type=int, default=None, help="fleet admin server port (0: ephemeral)")
    p.add_argument("--replica", action="append", default=[], metavar="I:KEY=VALUE,...",
                   help="per-replica override, repeatable")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="asyncio",
                   help="event loop (auto: uvloop when installed: pip install 'kvgate[uvloop]'; "
                        "its timers have 1 ms resolution)")
    return p


def _parse_overrides(specs: Sequence[str], replicas: int) -> dict[int, dict[str, str]]:
    overrides: dict[int, dict[str, str]] = {}
    for spec in specs:
        index_text, sep, rest = spec.partition(":")
        if not sep or not index_text.strip().isdigit():
            raise ValueError(f"--replica {spec!r}: expected I:KEY=VALUE,...")
        index = int(index_text)
        if index >= replicas:
            raise ValueError(f"--replica {spec!r}: there are only {replicas} replicas")
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"--replica {spec!r}: {item!r} is not KEY=VALUE")
            overrides.setdefault(index, {})[key.strip()] = value.strip()
    return overrides


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _replica_config(
    index: int, args: argparse.Namespace, override: dict[str, str], role: Role, kv: KvTransferSettings,
) -> ReplicaConfig:
    engine = EngineConfig(
        model=args.model,
        served_loras=tuple(name for name in (s.strip() for s in args.loras.split(",")) if name),
        max_loras=args.max_loras,
        lora_load_time=args.lora_load_time,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        enable_prefix_caching=not args.no_prefix_caching,
        slowdown=args.slowdown,
        kv_events=args.kv_events_port is not None,
    )
    faults = Faults(error_rate=args.error_rate)
    profile: str = args.profile
    engine_changes: dict[str, Any] = {}
    fault_changes: dict[str, object] = {}
    for key, value in override.items():
        if key in _ENGINE_INT_KEYS:
            engine_changes[key] = int(value)
        elif key in _ENGINE_FLOAT_KEYS:
            engine_changes[key] = float(value)
        elif key == "enable_prefix_caching":
            engine_changes[key] = _bool(value)
        elif key == "loras":
            engine_changes["served_loras"] = tuple(name for name in value.split("+") if name)
        elif key == "profile":
            profile = value
        elif key == "role":
            if value not in ROLES:
                raise ValueError(f"--replica {index}: role must be one of {', '.join(ROLES)}")
            role = value
        elif key in FAULT_FIELDS and key != "slowdown":
            fault_changes[key] = value
        else:
            raise ValueError(f"--replica {index}: unknown key {key!r}")
    return ReplicaConfig(
        index=index,
        engine=dataclasses.replace(engine, **engine_changes),
        profile=profile,
        dialect=args.engine,
        time_scale=args.time_scale,
        seed=args.seed,
        faults=faults.updated(fault_changes),
        stream_interval=args.stream_interval,
        image_tokens=ImageGrid() if args.image_grid else args.image_tokens,
        role=role,
        kv_transfer=kv,
    )


def fleet_config(args: argparse.Namespace) -> FleetConfig:
    """The fleet an argument namespace describes; raises ValueError on inconsistent values."""
    roles = _roles(args)
    if args.time_scale <= 0:
        raise ValueError("--time-scale must be > 0")
    kv = KvTransferSettings(bandwidth_gbs=args.kv_bandwidth_gbs, latency_s=args.kv_latency_ms / 1000,
                            kv_bytes_per_token=args.kv_bytes_per_token, hold_timeout_s=args.kv_hold_timeout)
    if args.kv_events_connect is not None and args.kv_events_port is None:
        raise ValueError("--kv-events-connect needs --kv-events-port (the replay sockets' port - 1)")
    if args.tokenizer is not None and not Path(args.tokenizer).is_file():
        raise ValueError(f"--tokenizer {args.tokenizer!r}: no such file")
    if args.image_tokens < 1:
        raise ValueError("--image-tokens must be >= 1")
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        raise ValueError("--ssl-certfile and --ssl-keyfile go together")
    overrides = _parse_overrides(args.replica, len(roles))
    replicas = tuple(_replica_config(i, args, overrides.get(i, {}), role, kv) for i, role in enumerate(roles))
    return FleetConfig(replicas=replicas, port=args.port, host=args.host, hosts_from=args.hosts_from,
                       admin_port=args.admin_port, kv_events_port=args.kv_events_port,
                       tokenizer=args.tokenizer, kv_events_connect=args.kv_events_connect,
                       ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)


def _roles(args: argparse.Namespace) -> list[Role]:
    """Each replica's role, in replica order (prefill, then decode, then both)."""
    if args.prefill < 0 or args.decode < 0:
        raise ValueError("--prefill and --decode must be >= 0")
    if args.prefill or args.decode:
        if args.role != "both":
            raise ValueError("--role applies without --prefill/--decode; give one or the other")
        extra = args.replicas or 0
        if extra < 0:
            raise ValueError("--replicas must be >= 0")
        prefill: list[Role] = ["prefill"] * args.prefill
        decode: list[Role] = ["decode"] * args.decode
        both: list[Role] = ["both"] * extra
        return prefill + decode + both
    count = 1 if args.replicas is None else args.replicas
    if count < 1:
        raise ValueError("--replicas must be >= 1")
    return [args.role] * count


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def _serve(config: FleetConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await run_until(Fleet(config), stop)


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    try:
        config = fleet_config(args)
        # fail fast on an unknown profile, before any listener starts
        from kvgate.simulator.profiles import load_profile

        for replica in config.replicas:
            load_profile(replica.profile)
    except (ValueError, OSError, KeyError) as exc:
        parser.error(str(exc))
    try:
        factory = _loop_factory(args.loop)
    except ImportError:
        parser.error("--loop uvloop: uvloop is not installed (pip install 'kvgate[uvloop]')")
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve(config))
    except OSError as exc:
        print(f"kvgate-sim: cannot listen: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
