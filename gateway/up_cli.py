"""``kvgate up``'s command line: its flags, the ready lines it prints, and the run until a signal."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvgate.gateway.controlplane.downstream import DownstreamSettings
from kvgate.gateway.picker.tracing import add_tracing_flags, tracing_from_args
from kvgate.gateway.picker.workers import byte_size, resolve_workers, workers_argument
from kvgate.gateway.processes import event_loop, logs
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import DEFAULT_SIM_REPLICAS, EXAMPLE_MODEL, UpOptions
from kvgate.policies.errors import ConfigError
from kvgate.policies.state import DEFAULT_MAX_SESSIONS


def ready_lines(up: KvgateUp, options: UpOptions) -> list[str]:
    """What ``kvgate up`` prints once Envoy listens: where, a request to try, and what is missing."""
    pools = up.picker.table.pools if up.picker is not None else {}
    declared = [model for pool in pools.values() for model in (*pool.spec.models, *pool.spec.route_models)]
    simulated = options.sim_model or EXAMPLE_MODEL
    model = simulated if up.fleets else declared[0] if declared else "MODEL"
    body = f'{{"model": "{model}", "prompt": "Say hello", "max_tokens": 16}}'
    lines = [
        f"kvgate ready: {up.url} (admin {up.admin_url}; config {up.options.config_source})",
        f"  curl {up.url}/v1/completions -H 'content-type: application/json' -d '{body}'",
        f"  OpenAI SDKs: base_url {up.url}/v1 (also the Responses API); Anthropic SDKs: {up.url}",
        f"  kvgate status --admin {up.admin_url}",
    ]
    for name, pool in sorted(pools.items()):
        if pool.spec.roles:
            roles = [pool.spec.role_of(address).value for address in pool.spec.endpoints]
            counts = ", ".join(f"{roles.count(r)} {r}" for r in ("prefill", "decode", "both") if r in roles)
            lines.append(f"  pool {name}: disaggregated ({counts}; profile {pool.spec.profile}, prefill "
                         f"run by the {pool.spec.pd_execution})")
        if not pool.spec.endpoints:
            lines.append(f"  note: pool {name} has no endpoints, so its requests answer 503: add its model "
                         "servers as Pods to the manifests, or start simulated ones with --sim N")
    return lines


def port_number(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (up to 65535)")
    return value


def listen_port(text: str) -> int:
    """The gateway's port: 1 to 65535."""
    value = port_number(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not a port the gateway can listen on (1-65535)")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not 0 or more seconds")
    return value


def count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse


async def serve(options: UpOptions) -> int:
    """Start, print the ready lines, serve until a signal (0) or until Envoy cannot be kept running
    (1, the reason on stderr)."""
    up = KvgateUp(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(up.start())
    stopping = asyncio.create_task(stop.wait())
    served = False
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            return 0
        starting.result()  # raises a startup failure
        served = True
        for line in ready_lines(up, options):
            print(line, flush=True)
        assert up.supervisor is not None
        failed: asyncio.Future[str] = up.supervisor.failed
        ends: set[asyncio.Future[Any]] = {stopping, failed}
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        if failed.done() and not stop.is_set():
            print(f"kvgate up: {failed.result()}", file=sys.stderr, flush=True)
            return 1
        if options.drain_timeout_s > 0:
            await _drain(up, stop, options.drain_timeout_s)
        return 0
    finally:
        stopping.cancel()
        await up.stop()
        if served:
            print("kvgate stopped", flush=True)


async def _drain(up: KvgateUp, stop: asyncio.Event, timeout_s: float) -> None:
    """Let the requests in flight finish (a rolling update must not cut LLM streams), until they
    have or ``timeout_s`` passed or a second signal comes."""
    stop.clear()
    print(f"kvgate draining: no new connections; waiting up to {timeout_s:g} s for the requests in "
          "flight (a second signal stops now)", flush=True)
    draining = asyncio.create_task(up.drain(timeout_s))
    again = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({draining, again}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        again.cancel()
        if not draining.done():
            draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await draining
    if draining.done() and not draining.cancelled():
        left = draining.result()
        if left:
            print(f"kvgate drain timed out: {left} request(s) still in flight are cut", file=sys.stderr,
                  flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate up", description="Run Envoy, kvgate's control plane and picker (and a simulated fleet)."
    )
    parser.add_argument("-f", "--filename", dest="directory", type=Path, default=None,
                        help="directory of manifests (default: the bundled example)")
    parser.add_argument("--kubernetes", action="store_true",
                        help="follow the Kubernetes cluster (the kubeconfig, else in-cluster) instead of -f")
    parser.add_argument("--kubeconfig", default=None, metavar="FILE",
                        help="kubeconfig file (with --kubernetes)")
    parser.add_argument("--namespace", default=None, metavar="NS",
                        help="follow this namespace only (with --kubernetes; default: all)")
    parser.add_argument("--kube-api", default=None, metavar="URL",
                        help="an API server URL needing no credentials, e.g. kubectl proxy's "
                        "(with --kubernetes)")
    parser.add_argument("--lease-namespace", default=None, metavar="NS",
                        help="namespace of the status Lease that kvgate replicas elect a writer with "
                        "(with --kubernetes; default: --namespace, else this Pod's own, else default)")
    parser.add_argument("--gateway-address", action="append", default=[], metavar="ADDR",
                        help="an address (IP or hostname) Gateways' status reports, e.g. the Service "
                        "in front of kvgate (with --kubernetes; repeatable; default: --host unless "
                        "it is a wildcard)")
    parser.add_argument("--port", type=listen_port, default=8080, help="port Envoy listens on (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="address Envoy listens on (default 127.0.0.1)")
    parser.add_argument("--admin-host", default="127.0.0.1",
                        help="address the admin server (metrics, readiness, status) binds "
                        "(default 127.0.0.1)")
    parser.add_argument("--admin-port", type=port_number, default=9090,
                        help="admin HTTP port: /status, /metrics, /readyz (0 = any free; default 9090)")
    parser.add_argument("--picker-port", type=port_number, default=0,
                        help="ext_proc gRPC port (default: any free)")
    parser.add_argument("--xds-port", type=port_number, default=0, help="ADS gRPC port (default: any free)")
    parser.add_argument("--envoy-admin-port", type=port_number, default=0,
                        help="Envoy admin port (default: any free)")
    parser.add_argument("--sim", type=count(0), default=None, metavar="N",
                        help=f"simulated replicas (default {DEFAULT_SIM_REPLICAS} without -f, 0 with -f)")
    parser.add_argument("--sim-pool", default=None, metavar="NAME",
                        help="InferencePool the simulated replicas join (needed when there are several)")
    parser.add_argument("--sim-hosts-from", default="127.0.1.1", metavar="IP",
                        help="address of the first simulated replica (default 127.0.1.1)")
    parser.add_argument("--sim-processes", type=int, default=1, metavar="K",
                        help="spread the simulated replicas over K processes (one process serves a few "
                        "thousand requests a second: a benchmark on many cores needs more)")
    parser.add_argument("--sim-time-scale", type=float, default=1.0,
                        help="simulator real seconds per simulated second (0.1: ten times faster)")
    parser.add_argument("--sim-model", default=None, help="model the simulated replicas serve")
    parser.add_argument("--sim-tokenizer", default=None, metavar="FILE",
                        help="the simulated replicas tokenize with this tokenizer.json (default: the pool's "
                        "kvgate.io/tokenizer, which the picker keys prompts with; the repository's "
                        "simulator/data is the simulated model's)")
    parser.add_argument("--sim-prefill", type=count(0), default=0, metavar="N",
                        help="simulated prefill replicas: a disaggregated fleet (with --sim-decode; without "
                             "-f: the bundled example pool with profile pd)")
    parser.add_argument("--sim-decode", type=count(0), default=0, metavar="M",
                        help="simulated decode replicas (--sim then counts replicas of role both, default 0)")
    parser.add_argument(
        "--redis", default=None, metavar="URL",
        help="share the picker's state and tenant limits with other kvgate replicas "
        "(e.g. redis://127.0.0.1:6379/0); default: in process",
    )
    parser.add_argument("--envoy-log-level", default="warning")
    parser.add_argument("--envoy-concurrency", type=int, default=0, metavar="N",
                        help="Envoy worker threads (default 0: one per core)")
    parser.add_argument("--privileged-port-offset", type=count(0), default=0, metavar="N",
                        help="bind Gateway listener ports below 1024 (other than the one --port binds) "
                        "at the port + N, e.g. 10000 in a container without privileges, its Service "
                        "mapping them back (default 0: as written)")
    parser.add_argument("--drain-timeout", type=seconds, default=60.0, metavar="SECONDS",
                        help="on SIGTERM or Ctrl-C, stop taking connections and let the requests in "
                        "flight (streams too) finish for up to SECONDS before stopping (0: stop at "
                        "once; a second signal stops at once; default 60)")
    parser.add_argument("--stream-idle-retry", type=float, default=30.0, metavar="SECONDS",
                        help="a streamed request whose replica sends nothing this long is retried on the "
                        "next endpoint, if nothing reached the client yet (0: never; default 30)")
    parser.add_argument("--attempt-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="a non-streamed request with max_tokens whose replica has not answered in "
                        "SECONDS plus --attempt-timeout-per-token a token is retried on the next "
                        "endpoint (0: never; default 30)")
    parser.add_argument("--attempt-timeout-per-token", type=float, default=0.1, metavar="SECONDS",
                        help="seconds each requested token adds to --attempt-timeout (default 0.1)")
    parser.add_argument("--request-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="a client must send its whole request within SECONDS, else 408 (the "
                        "response is not bounded by it; default 60)")
    parser.add_argument("--request-headers-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a client must send a request's headers within SECONDS, else 408 (default 10)")
    parser.add_argument("--access-log", type=Path, default=None, metavar="FILE",
                        help="Envoy writes one JSON line per request to FILE (client, model, status, "
                        "Envoy's response flags, the picked and the serving endpoint, durations)")
    parser.add_argument("--max-connections", type=count(1), default=50_000, metavar="N",
                        help="open client connections Envoy accepts over all listeners (default 50000)")
    parser.add_argument("--skip-unread-responses", action=argparse.BooleanOptionalAction, default=True,
                        help="a request whose response nothing needs (no rewrite, no token limit, not "
                        "sampled) skips the response-headers round trip: less picker CPU; Envoy reports "
                        "its status and served endpoint afterwards (gRPC access log, every 50 ms). "
                        "Default on; --no-skip-unread-responses keeps the round trip for every request")
    parser.add_argument("--shared-scrapes", action=argparse.BooleanOptionalAction, default=True,
                        help="with Redis (--redis or --workers): one picker per pool scrapes the model "
                        "servers for all (default on); --no-shared-scrapes: each scrapes them itself")
    parser.add_argument("--shared-fairness", action=argparse.BooleanOptionalAction, default=True,
                        help="with Redis and flow control: pickers share each tenant's held and "
                        "dispatched work, so fairness between tenants holds across them (default on)")
    parser.add_argument("--workers", type=workers_argument, default=1, metavar="N|auto",
                        help="picker processes, sharing state through Redis (--redis, else a private "
                        "redis-server); auto: one per two cores, at most 8 (1 without Redis); default 1")
    parser.add_argument("--max-request-body", type=byte_size, default=UpOptions().max_request_body,
                        metavar="BYTES",
                        help="the largest request body the gateway takes (e.g. 32MiB for long recordings "
                        "to speech-to-text models); a larger one is 413 (default 8MiB)")
    parser.add_argument("--max-session-pins", type=count(1), default=DEFAULT_MAX_SESSIONS, metavar="N",
                        help="session pins each pool keeps (x-session-id affinity, and the replica of each "
                        "stored Responses API response); the least recent go first (default 100000)")
    add_tracing_flags(parser)
    parser.add_argument("--read-usage-every", type=count(0), default=0, metavar="N",
                        help="read one response in N for its usage (token metrics, the prefix index's "
                        "checks) where the one-pass data path would skip it; 0 (default): only where "
                        "needed")
    parser.add_argument("--log-level", default="WARNING")
    event_loop.add_loop_argument(parser)
    return parser


def options_from_args(args: argparse.Namespace) -> UpOptions:
    """The options ``kvgate up``'s command line (``build_parser``) stands for."""
    return UpOptions(
        directory=args.directory,
        kubernetes=args.kubernetes,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        kube_api=args.kube_api,
        lease_namespace=args.lease_namespace,
        gateway_addresses=tuple(args.gateway_address),
        port=args.port,
        host=args.host,
        drain_timeout_s=args.drain_timeout,
        privileged_port_offset=args.privileged_port_offset,
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        picker_port=args.picker_port,
        xds_port=args.xds_port,
        envoy_admin_port=args.envoy_admin_port,
        sim=args.sim,
        sim_pool=args.sim_pool,
        sim_hosts_from=args.sim_hosts_from,
        sim_time_scale=args.sim_time_scale,
        sim_processes=args.sim_processes,
        max_request_body=args.max_request_body,
        sim_model=args.sim_model,
        sim_tokenizer=args.sim_tokenizer,
        sim_prefill=args.sim_prefill,
        sim_decode=args.sim_decode,
        envoy_log_level=args.envoy_log_level,
        envoy_concurrency=args.envoy_concurrency,
        workers=resolve_workers(args.workers, args.redis),
        loop=args.loop,
        stream_idle_retry_s=args.stream_idle_retry,
        attempt_timeout_s=args.attempt_timeout,
        attempt_timeout_per_token_s=args.attempt_timeout_per_token,
        skip_unread_responses=args.skip_unread_responses,
        downstream=DownstreamSettings(
            request_timeout_s=args.request_timeout,
            request_headers_timeout_s=args.request_headers_timeout,
            max_connections=args.max_connections,
            access_log_path=str(args.access_log.resolve()) if args.access_log is not None else None,
        ),
        redis_url=args.redis,
        shared_scrapes=args.shared_scrapes,
        shared_fairness=args.shared_fairness,
        tracing=tracing_from_args(args),
        read_usage_every=args.read_usage_every,
        max_session_pins=args.max_session_pins,
    )


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    logs.configure(args.log_level)
    try:
        options = options_from_args(args)
        return event_loop.run(lambda: serve(options), args.loop)
    except event_loop.LoopUnavailable as exc:
        print(f"kvgate up: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"kvgate up: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
