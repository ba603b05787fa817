"""Every golden translation is ACKed by the real Envoy over kvgate's ADS server (nothing NACKed)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kvgate.gateway.controlplane.system_ca import system_ca_file
from kvgate.gateway.controlplane.translate import TranslationSettings
from kvgate.gateway.controlplane.xds import (
    ANY_NODE,
    CLUSTER,
    LISTENER,
    ROUTE,
    AdsServer,
    Snapshot,
    SnapshotCache,
    XdsStatus,
    bootstrap_for_ads,
    check_consistent,
)
from kvgate.gateway.picker.tls import self_signed
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from tests.gateway.controlplane.translate.golden import CASES, SETTINGS, translate_case

pytestmark = pytest.mark.e2e

NODE = "kvgate-translate-golden"
PORTS = (8080, 9090)


def _settings() -> TranslationSettings:
    mapped = tuple((port, free_port()) for port in PORTS)
    return TranslationSettings(
        picker_addresses=SETTINGS.picker_addresses, listen_ports=mapped,
        models_address=SETTINGS.models_address,
    )


async def _acked(status: XdsStatus, snapshot: Snapshot, case: str, limit_s: float = 10.0) -> None:
    wanted = {
        CLUSTER: snapshot.version_of(CLUSTER),
        LISTENER: snapshot.version_of(LISTENER),
        ROUTE: snapshot.version_of(ROUTE, list(snapshot.messages(ROUTE))),
    }
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for url in wanted:
            rejection = status.last_rejection(NODE, url)
            assert rejection is None, f"{case}: Envoy rejected {url}: {rejection.message}"
        types = status.nodes.get(NODE, {})
        if all(url in types and types[url].acked_version == version for url, version in wanted.items()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{case}: not ACKed within {limit_s} s: {status.as_dict()}")


async def test_envoy_acks_every_golden_case(tmp_path: Path) -> None:
    # (a file Envoy can load where the golden files name the system's CA certificates)
    system_ca = system_ca_file()
    if system_ca is None:
        system_ca = str(tmp_path / "ca.pem")
        Path(system_ca).write_bytes(self_signed().cert_pem)  # noqa: ASYNC240 (before Envoy starts)
    snapshots = {case: translate_case(case, _settings(), system_ca).snapshot() for case in CASES}
    for snapshot in snapshots.values():
        check_consistent(snapshot)
    cache, status = SnapshotCache(), XdsStatus()
    cache.set_snapshot(ANY_NODE, snapshots[CASES[0]])  # Envoy waits for a first CDS/LDS before ready
    async with AdsServer(cache, observer=status) as ads:
        bootstrap = bootstrap_for_ads(NODE, ads.address, free_port())
        async with EnvoyProcess(bootstrap, EnvoyOptions(log_level="warning")):
            for case, snapshot in snapshots.items():
                cache.set_snapshot(ANY_NODE, snapshot)
                await _acked(status, snapshot, case)
    assert all(counter.nacks == 0 for counter in status.counters.values()), status.as_dict()
