"""``kvgate picker --pools FILE``: run the endpoint picker alone (for any gateway that speaks the
endpoint-picker protocol, e.g. Envoy configured by hand or by another control plane)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.picker import PickerService, PickerSettings
from gateway.pools_file import load_pools
from gateway.shared_state.link import RedisSettings
from policies.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate picker", description=__doc__)
    parser.add_argument("--pools", type=Path, required=True, help="YAML file of pools and endpoints")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port (0 = any free)")
    parser.add_argument("--admin-port", type=int, default=9090, help="metrics/health port (0 = any free)")
    parser.add_argument("--scrape-interval", type=float, default=0.05, help="seconds between scrapes")
    parser.add_argument("--stale-after", type=float, default=0.2, help="metrics older than this are stale")
    parser.add_argument(
        "--redis", default=None, metavar="URL",
        help="share scheduler state and tenant limits with other pickers (e.g. redis://127.0.0.1:6379/0); "
        "overrides the pools file's redis: key; default: in process",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser


async def _serve(args: argparse.Namespace) -> int:
    pools = load_pools(args.pools)
    redis_url = args.redis or pools.redis
    settings = PickerSettings(
        grpc_address=f"{args.host}:{args.grpc_port}",
        admin_host=args.host,
        admin_port=args.admin_port,
        scrape_interval=args.scrape_interval,
        stale_after=args.stale_after,
        redis=RedisSettings(url=redis_url) if redis_url else None,
    )
    service = PickerService(settings)
    service.apply_pools(pools.pools, pools.effective_default)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    print(
        f"kvgate-picker ready grpc={args.host}:{service.grpc_port} "
        f"admin=http://{args.host}:{service.admin.port}",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await service.stop()
    return 0


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(_serve(args))
    except ConfigError as exc:
        print(f"kvgate picker: {exc.message}", file=sys.stderr)
        return 2
