"""``kvgate up --sim N``'s fleet as the configuration sees it: the pool it joins, a Pod per replica,
and its addresses checked free before anything starts."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

from kvgate.gateway.controlplane.control_plane import (
    KV_EVENTS_BIND_ANNOTATION,
    KV_EVENTS_PORT_ANNOTATION,
    KV_EVENTS_REPLAY_PORT_ANNOTATION,
    TOKENIZER_ANNOTATION,
)
from kvgate.gateway.controlplane.resources import ResourceSet
from kvgate.gateway.controlplane.resources.core import Pod
from kvgate.gateway.controlplane.resources.inference import InferencePool
from kvgate.gateway.processes.envoy_process import free_port, port_in_use
from kvgate.policies.errors import ConfigError
from kvgate.policies.types import ROLE_LABEL


def find_pool(resources: ResourceSet, name: str | None) -> InferencePool:
    """The InferencePool named ``name`` (``name`` or ``namespace/name``), or the only one."""
    pools = resources.inference_pools
    if name is None:
        if len(pools) != 1:
            found = ", ".join(str(pool.key) for pool in pools) or "none"
            raise ConfigError(f"--sim needs --sim-pool: the configuration has these pools: {found}")
        return pools[0]
    for pool in pools:
        if name in (str(pool.key), pool.metadata.name):
            return pool
    raise ConfigError(f"--sim-pool {name!r}: no such InferencePool")


def sim_kv_events_port(pool: InferencePool) -> int | None:
    """The port the simulated replicas publish KV events on: the pool's ``kvgate.io/kv-events-port``
    (the picker subscribes where the pool says; None: they publish none). Where the picker binds
    (``kvgate.io/kv-events-bind``): the replay port - 1 (their replay sockets), else any free port."""
    annotations = pool.metadata.annotations
    try:
        if KV_EVENTS_PORT_ANNOTATION in annotations:
            return int(annotations[KV_EVENTS_PORT_ANNOTATION])
        if KV_EVENTS_BIND_ANNOTATION in annotations:
            replay = annotations.get(KV_EVENTS_REPLAY_PORT_ANNOTATION)
            return int(replay) - 1 if replay and int(replay) > 1 else free_port()
    except ValueError:
        return None  # the control plane warns about it and subscribes to nothing
    return None


def sim_kv_events_connect(pool: InferencePool) -> str | None:
    """Where the simulated replicas connect their publishers: the pool's ``kvgate.io/kv-events-bind``,
    a wildcard host read as this machine (None: they bind their own)."""
    bind = pool.metadata.annotations.get(KV_EVENTS_BIND_ANNOTATION, "").strip()
    if not bind:
        return None
    scheme, _, rest = bind.partition("://")
    host, _, port = rest.rpartition(":")
    if host in ("*", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"{scheme}://{host}:{port}"


def sim_tokenizer(pool: InferencePool, given: str | None) -> str | None:
    """The tokenizer.json the simulated replicas tokenize with: ``--sim-tokenizer``, else the pool's
    ``kvgate.io/tokenizer`` (its ``tokenizer.json`` when it names a model directory), so the replicas
    and the picker tokenize alike without saying it twice."""
    if given is not None:
        return given
    text = pool.metadata.annotations.get(TOKENIZER_ANNOTATION, "").strip()
    if not text:
        return None
    path = Path(text).expanduser()
    return str(path / "tokenizer.json" if path.is_dir() else path)


def selected_labels(pool: InferencePool) -> dict[str, str]:
    """Labels that ``pool``'s selector selects: its ``matchLabels``, and for its expressions the first
    value an ``In`` names and any value for ``Exists`` (``NotIn`` and ``DoesNotExist`` hold
    without the label)."""
    labels = dict(pool.spec.selector.match_labels)
    for requirement in pool.spec.selector.match_expressions:
        if requirement.operator == "In":
            labels[requirement.key] = requirement.values[0]
        elif requirement.operator == "Exists":
            labels[requirement.key] = "true"
    return labels


def sim_pods(pool: InferencePool, hosts: Sequence[str], roles: Sequence[str] = ()) -> tuple[Pod, ...]:
    """One ready Pod per simulated replica, labelled to match ``pool``'s selector, and with its role
    (``roles[i]``; none or ``both``: no role label) as llm-d labels it (``llm-d.ai/role``)."""
    pods = []
    for index, host in enumerate(hosts):
        labels = selected_labels(pool)
        role = roles[index] if index < len(roles) else "both"
        if role != "both":
            labels[ROLE_LABEL] = role
        pods.append(Pod.model_validate({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"kvgate-sim-{pool.metadata.name}-{role + '-' if role != 'both' else ''}{index}",
                "namespace": pool.metadata.namespace,
                "labels": labels,
            },
            "status": {"phase": "Running", "podIP": host},
        }))
    return tuple(pods)


def process_shares(roles: Sequence[str], processes: int) -> list[tuple[int, Sequence[str]]]:
    """The replicas (index of the first, roles) each of ``processes`` simulator processes runs:
    contiguous runs of the fleet's order, as even as they divide. One Python process serves a few
    thousand requests a second at the smallest time scale: on a machine with cores to spare, a
    benchmark's fleet in one process is the bottleneck the gateway is measured against."""
    count = max(1, min(processes, len(roles)))
    shares: list[tuple[int, Sequence[str]]] = []
    start = 0
    for index in range(count):
        end = start + len(roles) // count + (1 if index < len(roles) % count else 0)
        shares.append((start, roles[start:end]))
        start = end
    return shares


def host_of(url: str) -> str:
    return url.removeprefix("http://").rstrip("/").rpartition(":")[0].strip("[]")


def nth_host(hosts_from: str, index: int) -> str:
    return str(ipaddress.ip_address(hosts_from) + index)


def sim_hosts(hosts_from: str, replicas: int) -> list[str]:
    """The addresses the simulator gives its replicas: ``hosts_from``, then the next ones."""
    first = ipaddress.ip_address(hosts_from)
    return [str(first + index) for index in range(replicas)]


def check_sim_addresses_free(hosts_from: str, replicas: int, port: int) -> None:
    """One line, at start, when a simulated replica's address is taken (another kvgate up's
    replicas, most likely)."""
    taken = [host for host in sim_hosts(hosts_from, replicas) if port_in_use(host, port)]
    if taken:
        next_block = ipaddress.ip_address(hosts_from) + 256
        raise ConfigError(
            f"the simulated replicas' address {taken[0]}:{port} is in use by another process (another "
            f"kvgate up?): give this one --sim-hosts-from {next_block}"
        )
