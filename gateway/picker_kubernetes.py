"""``kvgate picker --kubernetes --pool-name NAME [--pool-namespace NS]``: the endpoint picker as a
drop-in for the Inference Extension's, behind a gateway someone else runs (GKE Gateway, Istio,
kgateway, Envoy Gateway): it follows one InferencePool in the cluster (its selected Pods, target
port, InferenceObjectives and InferenceModelRewrites, through ``gateway.controlplane.kubernetes``)
and serves it with the flags, ports and defaults of ``kvgate picker`` (ext_proc 9002 over TLS,
gRPC health 9003, metrics 9090). The pool is the picker's default pool, so gateways that send no
pool name reach it. Configuration that does not load keeps the last good pool.

``--endpoint-selector SELECTOR --endpoint-target-ports P[,P]`` instead of ``--pool-name`` is the
Inference Extension's mode without its APIs (its "standalone" chart, llm-d's batch and RL jobs: no
InferencePool CRD installed): the Pods the selector selects (Kubernetes' label selector syntax) in
the namespace, on those ports, are the pool; only Pods are followed (no InferenceObjectives, no
rewrites: the APIs that carry them may not exist). The pool is named after the picker's Deployment
(``POD_NAME`` less its ReplicaSet's and Pod's suffixes, as the Inference Extension names it), else
``endpoint-selector``. The namespace, in both modes: ``--pool-namespace``, else this Pod's
(``POD_NAMESPACE``, the mounted service account's), else ``NAMESPACE``, else ``default``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import signal
from collections.abc import Sequence
from typing import Any

from kvgate.gateway.controlplane.control_plane import ControlPlaneSettings, pool_annotations, pool_spec
from kvgate.gateway.controlplane.flow_annotations import FLOW_CONTROL_ANNOTATION
from kvgate.gateway.controlplane.kubernetes.client import KubeClient, own_namespace
from kvgate.gateway.controlplane.kubernetes.provider import PICKER_KINDS, KubernetesProvider
from kvgate.gateway.controlplane.kubernetes.review import MetricsAuthorizer
from kvgate.gateway.controlplane.resources import ConfigSnapshot, ObjectKey, ValidationOptions
from kvgate.gateway.controlplane.resources.label_selector import parse_selector
from kvgate.gateway.controlplane.resources.meta import DEFAULT_NAMESPACE
from kvgate.gateway.picker.cli import build_parser, ready_line, settings_from_args, warn_ignored
from kvgate.gateway.picker.epp_flags import EppDefaults, apply_epp_flags, epp_defaults, log_level
from kvgate.gateway.picker.pools_file import Dialect
from kvgate.gateway.picker.service import PickerService
from kvgate.gateway.processes import event_loop, logs
from kvgate.policies.errors import ConfigError

log = logging.getLogger(__name__)


def apply_snapshot(service: PickerService, snapshot: ConfigSnapshot, pool: ObjectKey,
                   args: argparse.Namespace | None = None, profile: str = "default",
                   defaults: EppDefaults | None = None) -> bool:
    """Serve ``pool`` as ``snapshot`` has it (the picker's flags' profile, engine, metrics port and KV
    events unless the pool names its own: ``gateway.picker.epp_flags``); False (the last pool kept)
    when it is not there."""
    found = next((p for p in snapshot.config.pools if p.key == pool), None)
    if found is None:
        log.warning("InferencePool %s/%s is not in the cluster (or does not load)", pool.namespace, pool.name)
        return False
    engine: Dialect = (args.default_engine if args is not None else None) or "vllm"
    settings = ControlPlaneSettings(picker_address="", default_profile=profile, default_engine=engine)
    spec, warnings = pool_spec(found, snapshot.resources, snapshot.config, settings)
    metrics_port = args.model_server_metrics_port if args is not None else None
    if spec.metrics_port is None and metrics_port is not None:
        spec = spec.model_copy(update={"metrics_port": metrics_port})
    if defaults is not None:
        annotations = pool_annotations(snapshot.resources, found)
        switched = annotations.get(FLOW_CONTROL_ANNOTATION, "").strip().lower()
        if switched == "false" and defaults.flow_control is not None:  # (the pool's own "off" wins)
            defaults = dataclasses.replace(defaults, flow_control=None)
        spec = defaults.apply(spec)
    for warning in warnings:
        log.warning("%s", warning)
    service.apply_pools([spec], spec.name)
    return True


POOL_GROUP = "inference.networking.k8s.io"
SELECTOR_POOL_NAME = "endpoint-selector"
"""The pool ``--endpoint-selector`` builds, where ``POD_NAME`` names no Deployment's Pod."""
_DEPLOYMENT_POD = re.compile(r"^(.+)-[a-z0-9]+-[a-z0-9]+$")


def pool_namespace(flag: str | None) -> str:
    """The namespace of the pool (module docstring)."""
    return (flag or own_namespace() or os.environ.get("NAMESPACE", "").strip() or DEFAULT_NAMESPACE)


def target_ports(text: str) -> tuple[int, ...]:
    """``--endpoint-target-ports``: 1 to 8 ports, comma-separated (repeats dropped, as the Inference
    Extension drops them)."""
    ports: list[int] = []
    for part in text.split(","):
        try:
            port = int(part.strip())
        except ValueError:
            raise ConfigError(f"--endpoint-target-ports {text!r}: {part.strip()!r} is not a port number "
                              "(e.g. 8000 or 8000,8001)") from None
        if not 0 < port < 65536:
            raise ConfigError(f"--endpoint-target-ports {text!r}: {port} is not a port (1-65535)")
        if port not in ports:
            ports.append(port)
    if len(ports) > 8:
        raise ConfigError(f"--endpoint-target-ports {text!r}: at most 8 ports")
    return tuple(ports)


def selector_pool(selector: str, ports: str | None, namespace: str, pod_name: str | None = None,
                  ) -> dict[str, Any]:
    """The InferencePool ``--endpoint-selector`` / ``--endpoint-target-ports`` stand for (module
    docstring), as a manifest. Raises ConfigError on a selector or ports it cannot read."""
    if not ports:
        raise ConfigError("--endpoint-selector needs --endpoint-target-ports (the model servers' ports, "
                          "e.g. 8000)")
    try:
        parsed = parse_selector(selector)
    except ValueError as exc:
        raise ConfigError(f"--endpoint-selector {selector!r}: {exc}") from None
    match = _DEPLOYMENT_POD.match(pod_name or "")
    return {
        "apiVersion": f"{POOL_GROUP}/v1",
        "kind": "InferencePool",
        "metadata": {"name": match.group(1) if match else SELECTOR_POOL_NAME, "namespace": namespace},
        "spec": {
            "selector": parsed.model_dump(mode="json", by_alias=True, exclude_defaults=True),
            "targetPorts": [{"number": port} for port in target_ports(ports)],
            "endpointPickerRef": {"name": "kvgate-picker"},  # (this picker: no Service is looked up)
        },
    }


async def serve(args: argparse.Namespace) -> int:
    selector = args.standalone_endpoint_selector
    namespace = pool_namespace(args.pool_namespace)
    kinds = PICKER_KINDS
    extra: tuple[dict[str, Any], ...] = ()
    if selector is not None:
        if args.pool_name:
            raise ConfigError("give --pool-name or --endpoint-selector, not both")
        extra = (selector_pool(selector, args.standalone_endpoint_target_ports, namespace,
                               os.environ.get("POD_NAME")),)
        kinds = tuple(kind for kind in PICKER_KINDS if kind.plural == "pods")
        pool = ObjectKey(namespace, extra[0]["metadata"]["name"])
    elif not args.pool_name:
        raise ConfigError("--kubernetes needs --pool-name NAME (and --pool-namespace NS), or "
                          "--endpoint-selector SELECTOR --endpoint-target-ports PORTS")
    elif args.pool_group != POOL_GROUP:  # (the Inference Extension's pre-v1 pools live in another group)
        raise ConfigError(f"--pool-group {args.pool_group}: kvgate follows {POOL_GROUP}/v1 InferencePools "
                          "only (the Inference Extension's v1 API)")
    else:
        pool = ObjectKey(namespace, args.pool_name)
    client = await KubeClient.connect(kubeconfig=args.kubeconfig, host=args.kube_api)
    provider = KubernetesProvider(
        client, namespace=namespace, options=ValidationOptions(require_picker_service=False),
        kinds=kinds, controller_name=None, extra_objects=extra,
    )
    service = PickerService(settings_from_args(args, args.redis))
    epp = epp_defaults(args)
    profile = epp.profile or "default"
    reviews: KubeClient | None = None
    if args.metrics_endpoint_auth is not False:  # the Inference Extension's default: on
        reviews = await KubeClient.connect(kubeconfig=args.kubeconfig, host=args.kube_api)
        service.admin.metrics_auth = MetricsAuthorizer(reviews)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        first = await provider.first()
        if not apply_snapshot(service, first, pool, args, profile, epp):
            raise ConfigError(f"InferencePool {pool.namespace}/{pool.name} not found in the cluster")
        await service.start()
        print(ready_line(args, service) + f" pool={pool.namespace}/{pool.name}", flush=True)
        async for snapshot in provider.updates(stop):
            apply_snapshot(service, snapshot, pool, args, profile, epp)
    finally:
        await service.stop()
        await provider.stop()
        if reviews is not None:
            await reviews.close()
    return 0


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    args.kubernetes = True  # (--endpoint-selector implies it)
    logs.configure(log_level(args))
    warn_ignored(args)
    try:
        apply_epp_flags(args)
        return event_loop.run(lambda: serve(args), args.loop)
    except event_loop.LoopUnavailable as exc:
        print(f"kvgate picker: {exc}", flush=True)
        return 2
    except ConfigError as exc:
        print(f"kvgate picker: {exc.message}", flush=True)
        return 2
