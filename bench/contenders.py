"""The routers the benchmark compares, each started in front of a running simulated fleet.

A :class:`Contender` starts its processes (``start(replica_urls, workdir) -> base URL``), and after a
run :meth:`Contender.check` says whether its routing policy really ran (from its log and metrics),
so that no peer is measured crippled, then :meth:`Contender.stop` ends its processes.

- ``envoy-rr`` / ``envoy-lr``: plain Envoy, a STATIC cluster of the replicas with ROUND_ROBIN /
  LEAST_REQUEST (no picker).
- ``kvgate-<profile>``: ``kvgate picker`` (own process) behind Envoy with the ext_proc config that
  ``kvgate up`` writes (``gateway.controlplane.envoy_config.static_bootstrap`` with ``ONE_PASS``: one pass per
  request, no response chunk to Python; since issue 19's outcome reports, as ``kvgate up``'s default:
  ``--skip-unread-responses --outcome-reports`` and Envoy's access log reporting outcomes);
  ``profile`` is a shipped name or a YAML path. A ``-w<N>``
  suffix (``kvgate-default-w4``) runs ``kvgate picker --workers N`` (state shared through a private
  Redis) and lists the workers' own ports in Envoy's ext_proc cluster (N Envoy workers). A ``-fd``
  suffix (``kvgate-default-fd``) configures GIE's full-duplex mode instead of the one pass (every
  response chunk through the picker: exact first tokens), to compare the two in one run. On a
  fleet that publishes KV events (``--kv-events``) kvgate subscribes and routes on them (the pool
  names the simulated model's tokenizer); a ``-approx`` suffix (``kvgate-default-approx``) leaves
  the pool without events: the approximate index alone, on the same fleet. A ``-flow`` suffix
  (``kvgate-default-flow``) turns the pool's flow control on (``docs/flow-control.md``; its defaults,
  the metrics staleness and queue timeout in simulated time).
- ``vllm-router-cache_aware`` / ``vllm-router-round_robin``: PyPI ``vllm-router`` (Rust).
- ``sglang-router-cache_aware``: PyPI ``sglang-router`` (``sglang-router launch``, Rust).
- ``oracle``: :mod:`bench.oracle_router` (greedy least estimated TTFT); ``oracle-spill``: the same
  with the cost of leaving the best-cached replica (``--miss-penalty-factor 1``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kvgate.bench.processes import ManagedProcess, http_get_text, metric_sum
from kvgate.extproc.prefill_client import DEFAULT_TIMEOUT_S as DEFAULT_PREFILL_TIMEOUT_S
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend, split_host_port
from kvgate.gateway.controlplane.envoy_config import (
    ONE_PASS,
    ExtProcSettings,
    GatewayConfig,
    static_bootstrap,
)
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from kvgate.policies.types import FailureMode

JsonDict = dict[str, Any]
REPORTED_ONE_PASS = dataclasses.replace(ONE_PASS, outcome_reports=True)
"""The ext_proc settings ``kvgate up`` writes by default (one pass, Envoy reporting outcomes)."""
_ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HCM_TYPE = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
             "HttpConnectionManager")


def plain_envoy_bootstrap(listen_port: int, admin_port: int, replicas: list[str], lb_policy: str) -> JsonDict:
    """Envoy with one STATIC cluster of the replicas (``ROUND_ROBIN`` or ``LEAST_REQUEST``)."""
    endpoints = []
    for url in replicas:
        host, _, port = url.removeprefix("http://").rpartition(":")
        endpoints.append({"endpoint": {"address": {"socket_address": {"address": host,
                                                                       "port_value": int(port)}}}})
    loose = {"max_connections": 1 << 20, "max_pending_requests": 1 << 20, "max_requests": 1 << 20}
    cluster = {
        "name": "replicas", "type": "STATIC", "lb_policy": lb_policy, "connect_timeout": "2s",
        "circuit_breakers": {"thresholds": [loose]},
        "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": endpoints}]},
    }
    route = {"match": {"prefix": "/"}, "route": {"cluster": "replicas", "timeout": "0s"}}
    hcm = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": _HCM_TYPE, "stat_prefix": "bench", "codec_type": "AUTO", "stream_idle_timeout": "600s",
            "route_config": {"name": "bench", "virtual_hosts": [{"name": "all", "domains": ["*"],
                                                                 "routes": [route]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER_TYPE}}],
        },
    }
    listener = {"name": "bench", "enable_reuse_port": False,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                "per_connection_buffer_limit_bytes": 64 * 1024 * 1024,
                "filter_chains": [{"filters": [hcm]}]}
    return {"node": {"id": "bench", "cluster": "bench"},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
            "static_resources": {"listeners": [listener], "clusters": [cluster]}}


@dataclass
class Contender:
    name: str
    kind: str  # envoy | kvgate | vllm-router | sglang-router | oracle
    option: str = ""  # lb policy / profile / router policy
    processes: list[ManagedProcess] = field(default_factory=list)
    envoy: EnvoyProcess | None = None
    metrics_url: str = ""
    metrics_urls: list[str] = field(default_factory=list)
    max_loras: int = 4  # the fleet's adapter slots (the oracle needs it)
    roles: tuple[str, ...] = ()
    """Each replica's role (``FleetSpec.roles``) in a disaggregated fleet; empty: all serve both."""
    time_scale: float = 1.0  # real seconds per simulated second: kvgate's clocks are scaled by it
    kv_events: dict[str, object] | None = None
    """The fleet's KV events as a pools file names them (``kvEvents``: port, tokenizer) when it
    publishes them: kvgate subscribes unless its name ends in ``-approx``."""
    _pool: dict[str, object] = field(default_factory=dict)
    """kvgate's pool as its pools file gives it."""

    async def start(self, replicas: list[str], workdir: Path) -> str:
        """Starts the contender in front of ``replicas``; returns its base URL."""
        port = free_port()
        if self.kind == "envoy":
            self.envoy = EnvoyProcess(plain_envoy_bootstrap(port, free_port(), replicas, self.option),
                                      EnvoyOptions())
            await self.envoy.start()
        elif self.kind == "kvgate":
            await self._start_kvgate(replicas, workdir, port)
        elif self.kind == "vllm-router":
            prom = free_port()
            if self.option == "pd":  # its vLLM P/D mode: NixlConnector's protocol, as kvgate's picker
                prefill = [url for url, role in zip(replicas, self.roles, strict=True) if role == "prefill"]
                decode = [url for url, role in zip(replicas, self.roles, strict=True) if role == "decode"]
                workers = ["--vllm-pd-disaggregation", *(a for url in prefill for a in ("--prefill", url)),
                           *(a for url in decode for a in ("--decode", url)), "--policy", "round_robin",
                           "--prefill-policy", "cache_aware", "--decode-policy", "round_robin"]
            else:
                workers = ["--worker-urls", *replicas, "--policy", self.option]
            proc = await self._spawn(workdir, [
                _router_binary("vllm-router"), "--host", "127.0.0.1", "--port", str(port), *workers,
                "--prometheus-port", str(prom), "--disable-retries",
                "--health-check-interval-secs", "300", "--log-level", "info",
            ])
            await proc.wait_for_port(port)
            self.metrics_url = f"http://127.0.0.1:{prom}/metrics"
        elif self.kind == "sglang-router":
            prom = free_port()
            proc = await self._spawn(workdir, [
                _router_binary("sglang-router"), "launch", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *replicas, "--policy", self.option, "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(prom),
            ])
            await proc.wait_for_port(port)
            self.metrics_url = f"http://127.0.0.1:{prom}/metrics"
        elif self.kind == "oracle":
            proc = await self._spawn(workdir, [
                sys.executable, "-m", "kvgate.bench.oracle_router", "--port", str(port), "--max-loras",
                str(self.max_loras), "--miss-penalty-factor", self.option or "0", "--replicas", *replicas,
            ])
            await proc.wait_for_log(r"^kvgate-oracle ready")
        else:
            raise ValueError(f"unknown contender kind {self.kind!r}")
        return f"http://127.0.0.1:{port}"

    async def _spawn(self, workdir: Path, cmd: list[str]) -> ManagedProcess:
        proc = ManagedProcess(self.name, cmd, workdir / f"{self.name}.log")
        await proc.start()
        self.processes.append(proc)
        return proc

    async def _start_kvgate(self, replicas: list[str], workdir: Path, port: int) -> None:
        addresses = [url.removeprefix("http://") for url in replicas]
        option, workers = split_workers(self.option)
        flow = option.endswith("-flow")
        option = option.removesuffix("-flow")
        approximate = option.endswith("-approx")
        option = option.removesuffix("-approx")
        full_duplex = option.endswith("-fd")
        option = option.removesuffix("-fd")
        profile = scaled_profile(option, self.time_scale, workdir / f"{self.name}.profile.yaml")
        pool: dict[str, object] = {"name": "bench", "endpoints": addresses, "profile": str(profile)}
        if self.kv_events is not None and not approximate:
            pool["kvEvents"] = self.kv_events
        if flow:  # flow control with its defaults, its wall-clock thresholds in simulated time
            pool["flowControl"] = {"metricsStalenessSeconds": 0.2 * self.time_scale,
                                   "queueTimeoutSeconds": min(1800.0, 30.0 * self.time_scale)}
        self._pool = pool
        if any(role != "both" for role in self.roles):
            pool["roles"] = dict(zip(addresses, self.roles, strict=True))
        pools = {"pools": [pool]}
        pools_path = workdir / f"{self.name}.pools.json"
        pools_path.write_text(json.dumps(pools))
        proc = await self._spawn(workdir, [
            sys.executable, "-m", "kvgate.gateway.cli", "picker", "--pools", str(pools_path),
            "--grpc-port", "0",
            "--secure-serving=false", "--grpc-health-port", "0",
            "--admin-port", "0", "--scrape-interval", f"{0.05 * self.time_scale:g}",
            "--stale-after", f"{0.2 * self.time_scale:g}", "--log-level", "WARNING",
            "--workers", str(workers),
            # the picker's prefill step and Envoy's wait for it, in simulated time (20 s and 30 s)
            "--prefill-timeout", f"{DEFAULT_PREFILL_TIMEOUT_S * self.time_scale:g}",
            # kvgate up's default: skip the response headers nothing reads, Envoy reports outcomes
            *(() if full_duplex else ("--skip-unread-responses", "--outcome-reports")),
        ])
        match = await proc.wait_for_log(r"^kvgate-picker ready grpc=([\d.]+):(\d+) admin=(\S+)(.*)")
        grpc_port = int(match.group(2))
        self.metrics_url = match.group(3) + "/metrics"
        pickers: tuple[tuple[str, int], ...] = (("127.0.0.1", grpc_port),)
        extra = dict(w.split("=", 1) for w in match.group(4).split() if "=" in w)
        if "admins" in extra:
            self.metrics_urls = [url + "/metrics" for url in extra["admins"].split(",")]
        if "grpc_workers" in extra:
            pickers = tuple(split_host_port(a) for a in extra["grpc_workers"].split(","))
        outcomes = tuple(split_host_port(a) for a in extra.get("outcomes", "").split(",") if a)
        settings = ExtProcSettings() if full_duplex else REPORTED_ONE_PASS
        # Envoy refuses a message timeout above an hour (3,600 s: 11 simulated s at time scale 320)
        message_timeout = min(3600.0, settings.message_timeout_s * self.time_scale)
        scaled = dataclasses.replace(settings, message_timeout_s=message_timeout)
        config = GatewayConfig(listen_port=port, admin_port=free_port(),
                               picker_addresses=pickers, outcome_addresses=outcomes,
                               pools=(PoolBackend("bench", FailureMode.FAIL_CLOSE, tuple(addresses)),),
                               settings=scaled)
        self.envoy = EnvoyProcess(static_bootstrap(config), EnvoyOptions(concurrency=workers))
        await self.envoy.start()

    def router_pids(self) -> list[int]:
        """The router's own processes (a kvgate supervisor's workers and Redis are its descendants)."""
        return [p.pid for p in self.processes if p.pid is not None]

    def envoy_pid(self) -> int | None:
        return self.envoy.pid if self.envoy is not None else None

    async def check(self) -> str:
        """'ok: …' when the contender's policy demonstrably ran, else 'CRIPPLED: …' / 'unknown: …'."""
        try:
            page = await http_get_text(self.metrics_url) if self.metrics_url else ""
        except Exception as exc:  # any failure to read is reported
            return f"unknown: metrics unreadable ({type(exc).__name__})"
        logs = "\n".join(p.log_text() for p in self.processes)
        if self.kind == "vllm-router":
            decisions = metric_sum(page, "vllm_router_policy_decisions_total", f'policy="{self.option}"')
            if "render_unavailable" in logs:
                return "CRIPPLED: log shows render_unavailable"
            if self.option == "cache_aware":
                rendered = metric_sum(page, "vllm_router_kv_routing_inputs_total", 'result="render"')
                hits = metric_sum(page, "vllm_router_prefix_routing_decisions_total", 'outcome="prefix_hit"')
                if decisions <= 0 or rendered <= 0:
                    return f"CRIPPLED: decisions={decisions:.0f} rendered={rendered:.0f}"
                return (f"ok: {decisions:.0f} cache_aware decisions, {rendered:.0f} renders, "
                        f"{hits:.0f} prefix hits")
            return f"ok: {decisions:.0f} {self.option} decisions"
        if self.kind == "sglang-router":
            picks = metric_sum(page, "smg_worker_selection_total", f'policy="{self.option}"')
            if picks <= 0:
                return f"CRIPPLED: no {self.option} selections in metrics"
            return f"ok: {picks:.0f} {self.option} selections (text radix tree, no tokenizer)"
        if self.kind == "kvgate":
            pages = [page]
            for url in self.metrics_urls[1:]:  # --workers: every worker's page
                try:
                    pages.append(await http_get_text(url))
                except Exception as exc:
                    return f"unknown: a worker's metrics unreadable ({type(exc).__name__})"
            per_worker = [
                metric_sum(p, "inference_extension_scheduler_e2e_duration_seconds_count") for p in pages
            ]
            picks = sum(per_worker)
            errors = sum(metric_sum(p, "inference_objective_request_error_total") for p in pages)
            if picks <= 0:
                return "CRIPPLED: the picker scheduled nothing"
            spread = f" (per worker {', '.join(f'{n:.0f}' for n in per_worker)})" if len(pages) > 1 else ""
            prefills = sum(metric_sum(p, "kvgate_prefill_duration_seconds_count") for p in pages)
            if prefills:  # disaggregated: the prefills the picker ran, and their mean time (simulated)
                failed = sum(metric_sum(p, "kvgate_prefill_total", 'outcome="failed"') for p in pages)
                mean = sum(metric_sum(p, "kvgate_prefill_duration_seconds_sum") for p in pages) / prefills
                spread += (f"; {prefills:.0f} prefills ({failed:.0f} failed), mean "
                           f"{mean / self.time_scale * 1000:.0f} ms")
            if "kvEvents" in self._pool:  # routed on the engines' reports: they must have come
                batches = sum(metric_sum(p, "kvgate_kv_events_batches_total") for p in pages)
                in_step = sum(metric_sum(p, "kvgate_kv_events_in_step") for p in pages)
                lost = sum(metric_sum(p, "kvgate_kv_events_unrecoverable_total") for p in pages)
                if batches <= 0:
                    return "CRIPPLED: no KV-event batches reached the picker"
                checks = "kvgate_kv_events_key_checks_total"
                held = sum(metric_sum(p, checks, 'outcome="held"') for p in pages)
                missing = sum(metric_sum(p, checks, 'outcome="missing"') for p in pages)
                untrusted = any(line.startswith("kvgate_kv_events_keys_trusted{") and line.endswith(" 0.0")
                                for p in pages for line in p.splitlines())
                if untrusted:
                    return (f"CRIPPLED: the engines did not hold kvgate's keys ({held:.0f} checks held, "
                            f"{missing:.0f} missing): routed on the approximate index")
                spread += (f"; KV events: {batches:.0f} batches, {in_step:.0f} endpoints in step, "
                           f"{lost:.0f} unrecoverable gaps, keys held in {held:.0f} of "
                           f"{held + missing:.0f} checks")
            return f"ok: {picks:.0f} picks, {errors:.0f} errors{spread}"
        if self.kind == "oracle":
            return "ok: peeks every replica per request"
        return "ok: Envoy built-in load balancer"

    async def stop(self) -> None:
        if self.envoy is not None:
            await self.envoy.stop()
            self.envoy = None
        for proc in reversed(self.processes):
            await proc.stop()
        self.processes.clear()


_CLOCKED = frozenset({"estimated-ttft-scorer", "conditional-pd-decider"})
"""Plugins with a ``time_scale``: the scorer measures its arrival rate on the clock, and the
decider compares its model-time margins with the scorer's clock-time estimates."""


def _scale_times(node: Any, factor: float) -> Any:
    if isinstance(node, dict):
        scaled = {k: (v * factor if k == "metrics_staleness_s" and isinstance(v, int | float)
                      else _scale_times(v, factor)) for k, v in node.items()}
        if scaled.get("type") in _CLOCKED:
            parameters = scaled.get("parameters")
            known = parameters if isinstance(parameters, dict) else {}
            scaled["parameters"] = {**known, "time_scale": factor}
        return scaled
    if isinstance(node, list):
        return [_scale_times(v, factor) for v in node]
    return node


def scaled_profile(name_or_path: str, time_scale: float, out: Path) -> Path:
    """A copy of a profile whose wall-clock thresholds (``metrics_staleness_s``) are × ``time_scale``.

    The picker's clock is real time; the fleet runs ``time_scale`` times slower than real, so the
    scrape interval (50 ms), staleness (200 ms) and these thresholds are scaled to stay the same in
    simulated time. The estimated-TTFT costs need no scaling (scores are ratios of like units) but
    its arrival rate does: its ``time_scale`` is set.
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text()
    else:
        text = resources.files("kvgate.policies").joinpath("profiles", f"{name_or_path}.yaml").read_text()
    document = _scale_times(yaml.safe_load(text), time_scale)
    halves = document.get("disaggregation")
    if isinstance(halves, dict):  # a disaggregated profile: its two profiles scaled too
        for half in ("decode", "prefill"):
            name = str(halves[half])
            if not (name.endswith((".yaml", ".yml")) or "/" in name) and path.parent != Path("."):
                sibling = path.parent / f"{name}.yaml"
                name = str(sibling) if sibling.exists() else name
            halves[half] = str(scaled_profile(name, time_scale, out.with_name(f"{out.stem}-{half}.yaml")))
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return out


def missing_tools(contenders: Sequence[str]) -> list[str]:
    """What the ``bench`` extra installs that a run of ``contenders`` needs and this environment
    lacks (checked before anything starts: a run that lacked one failed after its first contender)."""
    missing = [] if importlib.util.find_spec("matplotlib") is not None else ["matplotlib"]
    for router in ("vllm-router", "sglang-router"):
        if any(name.startswith(router) for name in contenders):
            try:
                _router_binary(router)
            except FileNotFoundError:
                missing.append(router)
    return missing


def _router_binary(name: str) -> str:
    """The router's console script next to this interpreter (the venv), else on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} is not installed: pip install 'kvgate[bench]' (or '.[bench]' in a checkout)"
        )
    return found


def make_contender(name: str) -> Contender:
    """``envoy-rr``, ``envoy-lr``, ``kvgate-<profile or path>``, ``vllm-router-<policy>``,
    ``sglang-router-<policy>``, ``oracle``."""
    if name == "envoy-rr":
        return Contender(name, "envoy", "ROUND_ROBIN")
    if name == "envoy-lr":
        return Contender(name, "envoy", "LEAST_REQUEST")
    if name == "oracle":
        return Contender(name, "oracle")
    if name == "oracle-spill":
        return Contender(name, "oracle", "1.0")
    for prefix, kind in (("kvgate-", "kvgate"), ("vllm-router-", "vllm-router"),
                         ("sglang-router-", "sglang-router")):
        if name.startswith(prefix):
            return Contender(name, kind, name[len(prefix):].partition("@")[0])
    raise ValueError(f"unknown contender {name!r}")


def split_workers(option: str) -> tuple[str, int]:
    """``default-w4`` → (``default``, 4); no ``-w<N>`` suffix → (option, 1)."""
    head, sep, tail = option.rpartition("-w")
    if sep and head and tail.isdigit() and int(tail) >= 1:
        return head, int(tail)
    return option, 1


def contender_for_profile_path(path: Path) -> Contender:
    """kvgate with a profile file (e.g. a tuned variant under bench/profiles/), named by its stem."""
    return Contender(f"kvgate-{path.stem}", "kvgate", str(path.resolve()))
