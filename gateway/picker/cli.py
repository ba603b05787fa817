"""``kvgate picker --pools FILE``: run the endpoint picker alone (for any gateway that speaks the
endpoint-picker protocol, e.g. Envoy configured by hand or by another control plane)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import get_args

from pydantic import ValidationError
from watchfiles import awatch

from kvgate.extproc.attempt_timeout import AttemptTimeout
from kvgate.extproc.lifecycle_config import EveryNth, LifecycleConfig
from kvgate.extproc.prefill_client import DEFAULT_TIMEOUT_S as DEFAULT_PREFILL_TIMEOUT_S
from kvgate.gateway.picker.epp_flags import (
    add_epp_flags,
    apply_epp_flags,
    epp_defaults,
    log_level,
    with_pool_defaults,
)
from kvgate.gateway.picker.pools_file import Dialect, ModelServerTlsSpec, PoolSpec, load_pools
from kvgate.gateway.picker.redis_link import RedisSettings
from kvgate.gateway.picker.service import PickerService, PickerSettings
from kvgate.gateway.picker.tracing import add_tracing_flags, tracing_from_args
from kvgate.gateway.picker.workers import (
    WorkerPlan,
    WorkerSupervisor,
    byte_size,
    resolve_workers,
    worker_base_command,
    workers_argument,
)
from kvgate.gateway.processes import event_loop, logs
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.policies.errors import ConfigError
from kvgate.policies.state import DEFAULT_MAX_SESSIONS
from kvgate.policies.validation import describe

log = logging.getLogger(__name__)


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds: {text!r}")
    return value


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 seconds or more: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate picker",
        description="Run the endpoint picker alone, for any gateway that speaks the endpoint-picker "
        "protocol (Envoy configured by hand or by another control plane). The pools file's format is "
        "in the README (kvgate picker --pools).",
    )
    parser.add_argument("--pools", type=Path, default=None,
                        help="YAML file of pools and endpoints (or --kubernetes)")
    cluster = parser.add_argument_group(
        "following one InferencePool in a Kubernetes cluster instead of --pools"
    )
    cluster.add_argument("--kubernetes", action="store_true",
                         help="the pool, its Pods, objectives and rewrites from the cluster")
    cluster.add_argument("--pool-name", default=None, help="the InferencePool to serve (with --kubernetes)")
    cluster.add_argument("--pool-namespace", default=None,
                         help="its namespace (default: this Pod's, POD_NAMESPACE or its service account's, "
                         "else NAMESPACE, else default)")
    cluster.add_argument("--pool-group", default="inference.networking.k8s.io",
                         help="the InferencePool's API group: kvgate follows the v1 API's (the "
                              "Inference Extension's flag; another group is refused)")
    cluster.add_argument("--kubeconfig", default=None, metavar="FILE",
                         help="kubeconfig (default: in-cluster)")
    cluster.add_argument("--kube-api", default=None, metavar="URL",
                         help="an API server URL needing no credentials (kubectl proxy's)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port (0 = any free)")
    parser.add_argument("--admin-port", "--metrics-port", dest="admin_port", type=int, default=9090,
                        help="metrics/health port (0 = any free; --metrics-port is the Inference "
                        "Extension's name for it)")
    parser.add_argument("--profile", default=None, metavar="NAME|FILE",
                        help="the scheduling profile of the pools that name none (a shipped one: default, "
                        "gie-default, pd, ...; or a profile file); default: default, or what --config-file "
                        "translates to (not both)")
    parser.add_argument("--engine", choices=get_args(Dialect), default=None,
                        help="the engine whose metrics the pools that name none export (default: what the "
                        "metric-name flags name, else vllm)")
    parser.add_argument("--scrape-interval", type=float, default=0.05, help="seconds between scrapes")
    parser.add_argument("--stale-after", type=float, default=0.2, help="metrics older than this are stale")
    parser.add_argument(
        "--redis", default=None, metavar="URL",
        help="share scheduler state and tenant limits with other pickers (e.g. redis://127.0.0.1:6379/0); "
        "overrides the pools file's redis: key; default: in process",
    )
    parser.add_argument(
        "--workers", type=workers_argument, default=1, metavar="N|auto",
        help="picker processes on the one gRPC port (SO_REUSEPORT), sharing state through Redis "
        "(--redis, else a private redis-server); auto: one per two cores, at most 8 (1 without "
        "Redis); default 1",
    )
    parser.add_argument(
        "--shared-scrapes", action=argparse.BooleanOptionalAction, default=True,
        help="with Redis (--redis or --workers): one picker per pool scrapes the model servers and "
        "the others adopt its scrapes, so N pickers do not scrape each server N times; a picker "
        "goes back to its own scrapes while none arrive (default on)",
    )
    parser.add_argument(
        "--shared-fairness", action=argparse.BooleanOptionalAction, default=True,
        help="with Redis and flow control: pickers share each tenant's held and dispatched work, so "
        "fairness between tenants holds across them (default on)",
    )
    parser.add_argument("--reuse-port", action="store_true",
                        help="bind the gRPC port with SO_REUSEPORT (set for each of --workers)")
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--own-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--watch", action="store_true",
                        help="reload the pools file when it changes (a bad file keeps the last good pools)")
    parser.add_argument(
        "--attempt-timeout", type=float, default=0.0, metavar="SECONDS",
        help="bound each attempt of a non-streamed request with max_tokens to SECONDS plus "
        "--attempt-timeout-per-token a token (Envoy's per-try timeout header), for data planes that "
        "retry on the picker's fallbacks; 0 (default): no bound",
    )
    parser.add_argument("--attempt-timeout-per-token", type=float, default=0.1, metavar="SECONDS",
                        help="seconds a requested token adds to --attempt-timeout (default 0.1)")
    parser.add_argument("--max-request-body", type=byte_size, default=LifecycleConfig().max_body_bytes,
                        metavar="BYTES",
                        help="the largest request body the picker reads (e.g. 32MiB: a long recording for "
                        "speech to text); a larger one is 413 (default 16MiB)")
    parser.add_argument("--max-session-pins", type=_at_least_one, default=DEFAULT_MAX_SESSIONS, metavar="N",
                        help="session pins each pool keeps (x-session-id affinity, and the replica of each "
                        "stored Responses API response); the least recent go first (default 100000)")
    upstream = parser.add_argument_group("the model servers' HTTPS (vLLM's --ssl-certfile)")
    upstream.add_argument("--model-server-metrics-scheme", choices=("http", "https"), default="http",
                          help="https: the model servers serve TLS (metrics and inference on one port); "
                          "the picker scrapes and sends its own requests (prefill, /v1/models) over it; "
                          "a pool's modelServerTls overrides it (default http)")
    upstream.add_argument("--model-server-metrics-https-insecure-skip-verify", type=flag_bool, nargs="?",
                          const=True, default=True, metavar="BOOL",
                          help="do not verify the model servers' certificates (default true, as the "
                          "Inference Extension's picker); false needs --model-server-ca-file")
    upstream.add_argument("--model-server-ca-file", default=None, metavar="FILE",
                          help="verify the model servers' certificates against this CA file (PEM; the "
                          "chain only: pods are reached by IP)")
    parser.add_argument("--drain-timeout", type=_non_negative_seconds, default=60.0, metavar="SECONDS",
                        help="on SIGTERM or Ctrl-C, refuse new requests and let those in flight end for "
                        "up to SECONDS before stopping (0: stop at once; a second signal stops at once; "
                        "default 60)")
    parser.add_argument("--prefill-timeout", type=_positive_seconds, default=DEFAULT_PREFILL_TIMEOUT_S,
                        metavar="SECONDS",
                        help="give up the prefill step of a disaggregated request after SECONDS and "
                        "serve it on its decode endpoint whole (pdExecution picker; default "
                        f"{DEFAULT_PREFILL_TIMEOUT_S:g}); keep it below the gateway's ext_proc message "
                        "timeout (Envoy's message_timeout; kvgate up's: 30 s)")
    add_tracing_flags(parser)
    parser.add_argument("--read-usage-every", type=int, default=0, metavar="N",
                        help="read one response in N for its usage (token metrics, the prefix "
                        "index's checks: kvgate_prefix_*) where the one-pass data path would skip it; "
                        "0 (default): only where a feature needs it")
    parser.add_argument("--skip-unread-responses", action="store_true",
                        help="with the one-pass processing mode: a request whose response nothing "
                        "needs skips the response-headers round trip (less CPU; its status and served "
                        "endpoint are then not seen)")
    parser.add_argument("--outcome-reports", action="store_true",
                        help="with --skip-unread-responses, behind an Envoy on this host whose gRPC access "
                        "log reports outcomes to this picker's --outcome-port (as kvgate up configures it): "
                        "skipped requests are marked for it, and their status and served endpoint count "
                        "when the report comes")
    parser.add_argument("--outcome-port", type=int, default=0,
                        help="loopback port (127.0.0.1) taking the outcome reports, apart from the ext_proc "
                        "port (with --outcome-reports; default 0: any free, named in the ready line)")
    tls = parser.add_argument_group(
        "serving, as the Inference Extension's endpoint picker (its flag names and defaults)"
    )
    tls.add_argument("--secure-serving", type=flag_bool, nargs="?", const=True, default=True,
                     metavar="BOOL", help="serve the ext_proc port over TLS (default true; "
                     "--secure-serving=false for plaintext)")
    tls.add_argument("--cert-path", type=Path, default=None, metavar="DIR",
                     help="directory holding tls.crt and tls.key; default: a self-signed certificate "
                     "made at start-up")
    tls.add_argument("--enable-cert-reload", type=flag_bool, nargs="?", const=True, default=False,
                     metavar="BOOL", help="follow --cert-path's files when they are rotated (default false)")
    tls.add_argument("--grpc-health-port", type=int, default=9003,
                     help="plaintext gRPC health port (default 9003; 0 = any free)")
    tls.add_argument("--metrics-endpoint-auth", type=flag_bool, nargs="?", const=True, default=None,
                     metavar="BOOL", help="require a bearer token the API server accepts (TokenReview) "
                     "and authorizes for GET /metrics (SubjectAccessReview) on the metrics port; "
                     "default true with --kubernetes, false otherwise (there is no API server to ask)")
    accepted = parser.add_argument_group(
        "the Inference Extension picker's flags that its charts pass and kvgate has no use for "
        "(accepted, so its manifests work unchanged; a warning names them)"
    )
    add_epp_flags(parser, accepted, flag_bool)
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    event_loop.add_loop_argument(parser)
    return parser


def warn_ignored(args: argparse.Namespace) -> None:
    """Name the accepted-but-unused flags that were given."""
    given = sorted(name.removeprefix("ignored_") for name, value in vars(args).items()
                   if name.startswith("ignored_") and value is not None)
    if given:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        log.warning("ignoring flags kvgate does not use: %s", flags)


def flag_bool(text: str) -> bool:
    """Go's flag syntax for booleans (``--flag=false``), which the Inference Extension's use."""
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes"):
        return True
    if value in ("0", "f", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def attempt_timeout(base_s: float, per_token_s: float) -> AttemptTimeout | None:
    """The flags' attempt bound (None for a base of 0)."""
    return AttemptTimeout(base_s, per_token_s) if base_s > 0 else None


async def _supervise(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``--workers N`` (N > 1): run N single-worker pickers on one port and watch over them."""
    pools = load_pools(args.pools)  # fail here, once, on a bad file
    plan = WorkerPlan(
        workers=args.workers,
        grpc_port=args.grpc_port or free_port(args.host),
        admin_port=args.admin_port,
        base_command=worker_base_command(argv),
    )
    supervisor = WorkerSupervisor(plan, args.redis or pools.redis)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await supervisor.start()
        admins, owns = supervisor.admin_urls, supervisor.own_addresses
        outcomes = f" outcomes={','.join(supervisor.outcome_addresses)}" if args.outcome_reports else ""
        print(
            f"kvgate-picker ready grpc={args.host}:{plan.grpc_port} admin={admins[0]} "
            f"workers={plan.workers} admins={','.join(admins)} grpc_workers={','.join(owns)}{outcomes} "
            f"redis={supervisor.redis_url} health={supervisor.healths[0]} "
            f"tls={str(args.secure_serving).lower()} loop={event_loop.running_loop_name()}",
            flush=True,
        )
        await supervisor.supervise(stop)
    finally:
        await supervisor.stop(args.drain_timeout + 5.0)  # (each worker drains its own requests)
    return 0


def settings_from_args(args: argparse.Namespace, redis_url: str | None) -> PickerSettings:
    """The picker's settings from its flags (also for ``--kubernetes``, ``gateway.picker_kubernetes``)."""
    return PickerSettings(
        grpc_address=f"{args.host}:{args.grpc_port}",
        admin_host=args.host,
        admin_port=args.admin_port,
        scrape_interval=args.scrape_interval,
        stale_after=args.stale_after,
        redis=RedisSettings(url=redis_url, share_scrapes=args.shared_scrapes,
                            share_fairness=args.shared_fairness) if redis_url else None,
        reuse_port=args.reuse_port,
        own_grpc_address=f"{args.host}:{args.own_port}" if args.worker_index is not None else None,
        lifecycle=LifecycleConfig(
            max_body_bytes=args.max_request_body,
            attempt_timeout=attempt_timeout(args.attempt_timeout, args.attempt_timeout_per_token),
            skip_unread_responses=args.skip_unread_responses,
            outcome_reports=args.outcome_reports,
            observe_usage=EveryNth(args.read_usage_every) if args.read_usage_every > 0 else None,
        ),
        secure_serving=args.secure_serving,
        cert_path=args.cert_path,
        cert_reload=args.enable_cert_reload,
        health_address=f"{args.host}:{args.grpc_health_port}",
        outcome_address=f"127.0.0.1:{args.outcome_port}" if args.outcome_reports else None,
        prefill_timeout=args.prefill_timeout,
        tracing=tracing_from_args(args),
        max_session_pins=args.max_session_pins,
        model_server_tls=model_server_tls_from_args(args),
    )


def model_server_tls_from_args(args: argparse.Namespace) -> ModelServerTlsSpec | None:
    """The model servers' HTTPS for pools that do not say (None: plain HTTP). Raises ConfigError for
    verification asked without a CA to verify against."""
    if args.model_server_metrics_scheme != "https" and args.model_server_ca_file is None:
        return None
    if not args.model_server_metrics_https_insecure_skip_verify and args.model_server_ca_file is None:
        raise ConfigError("--model-server-metrics-https-insecure-skip-verify false needs "
                          "--model-server-ca-file (kvgate verifies model servers against a CA file)")
    try:
        return ModelServerTlsSpec.model_validate({"ca_file": args.model_server_ca_file})
    except ValidationError as exc:
        raise ConfigError(f"--model-server-ca-file: {describe(exc)}") from None


def ready_line(args: argparse.Namespace, service: PickerService) -> str:
    own = f" own={args.host}:{service.extproc.own_port}" if args.worker_index is not None else ""
    outcomes = f" outcomes=127.0.0.1:{service.extproc.outcome_port}" if args.outcome_reports else ""
    return (
        f"kvgate-picker ready grpc={args.host}:{service.grpc_port} "
        f"admin=http://{args.host}:{service.admin.port}{own}{outcomes} "
        f"health={args.host}:{service.extproc.health_port} tls={str(args.secure_serving).lower()} "
        f"loop={event_loop.running_loop_name()}"
    )


async def _serve(args: argparse.Namespace) -> int:
    pools = load_pools(args.pools)
    redis_url = args.redis or pools.redis
    service = PickerService(settings_from_args(args, redis_url))
    epp = epp_defaults(args)

    def defaults(specs: Sequence[PoolSpec]) -> list[PoolSpec]:
        return with_pool_defaults(specs, epp.profile, args.default_engine, args.model_server_metrics_port,
                                  epp.kv_events, epp.flow_control)

    service.apply_pools(defaults(pools.pools), pools.effective_default)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    print(ready_line(args, service), flush=True)
    watcher = asyncio.create_task(_watch(args.pools, service, stop, defaults)) if args.watch else None
    try:
        await stop.wait()
        if args.drain_timeout > 0:
            await _drain(service, stop, args.drain_timeout)
    finally:
        if watcher is not None:
            watcher.cancel()
        await service.stop()
    return 0


async def _drain(service: PickerService, stop: asyncio.Event, timeout_s: float) -> None:
    """Let the requests in flight end (a rolling update must not cut the streams the gateway holds
    open to the picker: a full-duplex one lasts its whole response), or a second signal come."""
    stop.clear()
    log.info("draining: no new requests; waiting up to %g s for those in flight", timeout_s)
    draining = asyncio.create_task(service.drain(timeout_s))
    again = asyncio.create_task(stop.wait())
    await asyncio.wait({draining, again}, return_when=asyncio.FIRST_COMPLETED)
    again.cancel()
    if not draining.done():
        draining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await draining


async def _watch(path: Path, service: PickerService, stop: asyncio.Event,
                 defaults: Callable[[Sequence[PoolSpec]], list[PoolSpec]]) -> None:
    """Apply the pools file again whenever it changes (written whole and renamed into place, or a
    Kubernetes ConfigMap's symlink swapped: the whole folder is watched). A change elsewhere in the
    folder that leaves the file as it was does nothing: the picker's own log written there was one,
    and each reload logged again, a reload every ~40 ms for as long as the picker ran."""
    applier = PoolsFileApplier(path, lambda pools, default: service.apply_pools(defaults(pools), default))
    async for _changes in awatch(path.parent, stop_event=stop, debounce=50, step=20):
        applier.changed()


class PoolsFileApplier:
    """Applies a pools file when its content changed; says an error once, and its end."""

    def __init__(self, path: Path, apply: Callable[[Sequence[PoolSpec], str | None], None]) -> None:
        self._path = path
        self._apply = apply
        self._content: bytes | None = None
        self._error: str | None = None

    def changed(self) -> None:
        try:
            content: bytes | None = self._path.read_bytes()
        except OSError:
            content = None
        if content is not None and content == self._content:
            return
        self._content = content
        try:
            pools = load_pools(self._path)
            self._apply(pools.pools, pools.effective_default)  # (raises before changing anything)
        except ConfigError as exc:
            if exc.message != self._error:
                log.warning("keeping the last good pools: %s", exc.message)
            self._error = exc.message
            return
        if self._error is not None:
            log.warning("pools file valid again: %s", self._path)
        self._error = None


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    logs.configure(log_level(args))
    warn_ignored(args)
    try:
        apply_epp_flags(args)
    except ConfigError as exc:
        print(f"kvgate picker: {exc.message}", file=sys.stderr)
        return 2
    args.workers = resolve_workers(args.workers, args.redis)
    if args.pools is None:
        print("kvgate picker: give --pools FILE, or --kubernetes --pool-name NAME", file=sys.stderr)
        return 2
    if args.metrics_endpoint_auth:
        print("kvgate picker: --metrics-endpoint-auth needs --kubernetes (the API server decides)",
              file=sys.stderr)
        return 2
    try:
        if args.workers > 1:
            return event_loop.run(lambda: _supervise(args, argv), args.loop)
        return event_loop.run(lambda: _serve(args), args.loop)
    except event_loop.LoopUnavailable as exc:
        print(f"kvgate picker: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"kvgate picker: {exc.message}", file=sys.stderr)
        return 2
