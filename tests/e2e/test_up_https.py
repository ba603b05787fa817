"""HTTPS listeners through ``kvgate up`` and real Envoy: TLS terminated with the certificate of the
listener's Secret, chosen by the client's SNI; a Secret that cannot be served costs its listener
alone; a new certificate is served without a restart, and a broken one leaves the last good one
serving."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from kvgate.gateway.picker.tls import KeyPair, self_signed
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import wait_until
from tests.e2e.test_up_routing import (
    StartUp,
    pods_yaml,
    pool_ref,
    pool_yaml,
    sim_fleet,
    start_up,
    wait_ready,
)

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests

HOST = "llm.example.com"


def secret_yaml(name: str, pair: KeyPair) -> str:
    crt, key = (base64.b64encode(pem).decode() for pem in (pair.cert_pem, pair.key_pem))
    return f"""
apiVersion: v1
kind: Secret
metadata: {{name: {name}}}
type: kubernetes.io/tls
data: {{tls.crt: {crt}, tls.key: {key}}}
"""


def gateway_yaml(broken_port: int) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  gatewayClassName: kvgate
  listeners:
    - {{name: llm, port: 8443, protocol: HTTPS, hostname: {HOST}, tls: {{certificateRefs: [{{name: llm}}]}}}}
    - {{name: broken, port: {broken_port}, protocol: HTTPS, tls: {{certificateRefs: [{{name: missing}}]}}}}
"""


def client_context(pair: KeyPair) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=pair.cert_pem.decode())


async def test_https_listener_terminates_tls_and_follows_its_secret(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet = await sim_fleet(start_fleet, "127.0.5.1", port, "--model", "base")
    first = self_signed((HOST,))
    (tmp_path / "gateway.yaml").write_text(gateway_yaml(free_port()))
    (tmp_path / "secret.yaml").write_text(secret_yaml("llm", first))
    (tmp_path / "pool.yaml").write_text(pool_yaml("pool", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (tmp_path / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: llm}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref("pool")}]}}]
""")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool"])
    assert up.url.startswith("https://")
    async with http.get(f"{up.admin_url}/status") as response:
        status = await response.json()
    [gateway] = [e for e in status["resources"]
                 if e["kind"] == "Gateway" and e.get("sectionName") == "broken"]
    refs = {c["type"]: c for c in gateway["conditions"]}["ResolvedRefs"]
    assert (refs["status"], refs["reason"]) == ("False", "InvalidCertificateRef"), gateway
    [served] = status["certificates"]  # what kvgate status shows, with the days left
    assert (served["listener"], served["secret"]) == ("llm", "default/llm")
    expires = x509.load_pem_x509_certificate(first.cert_pem).not_valid_after_utc.timestamp()
    assert served["not_after"] == expires

    async def complete(pair: KeyPair) -> tuple[int, dict[str, object]]:
        body = {"model": "base", "prompt": "hi", "max_tokens": 2}
        async with http.post(f"{up.url}/v1/completions", json=body, ssl=client_context(pair),
                             server_hostname=HOST, headers={"host": HOST}) as reply:
            return reply.status, await reply.json()

    status_code, body = await complete(first)
    assert status_code == 200, body
    async with http.get(f"{up.admin_url}/metrics") as response:  # the control plane's own families
        page = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in (await response.text())
                .splitlines() if line.startswith("kvgate_") and not line.startswith("#")}
    not_after = x509.load_pem_x509_certificate(first.cert_pem).not_valid_after_utc.timestamp()
    assert page['kvgate_listener_certificate_expiry_timestamp_seconds{gateway="default/gw",listener="llm"}'] \
        == not_after
    assert page['kvgate_config_errors{stage="load"}'] == 0
    assert page['kvgate_xds_pushes_total{type="Listener"}'] >= 1
    assert page['kvgate_xds_rejections_total{type="Listener"}'] == 0
    async with http.get(f"{up.admin_url}/metrics/envoy") as response:  # Envoy's own, beside kvgate's
        assert response.status == 200
        envoy_page = await response.text()
    assert "envoy_http_downstream_rq_total" in envoy_page
    assert "envoy_listener_ssl_handshake" in envoy_page  # (the TLS listener's handshakes)
    # the broken listener is counted among the bad conditions (an alert's query)
    assert page['kvgate_resource_conditions{condition="ResolvedRefs",kind="Gateway",status="False"}'] == 1
    assert body["usage"]["completion_tokens"] == 2  # type: ignore[index]
    with pytest.raises(aiohttp.ClientOSError):  # plain HTTP is not served there: the connection reset
        async with http.post(up.url.replace("https://", "http://") + "/v1/completions", json={}) as reply:
            await reply.read()

    # the Secret rotated: new connections get the new certificate, without a restart
    second = self_signed((HOST,))
    (tmp_path / "secret.yaml").write_text(secret_yaml("llm", second))

    async def rotated() -> bool:
        try:
            return (await complete(second))[0] == 200
        except aiohttp.ClientError:
            return False

    await wait_until(rotated, "the new certificate served", timeout_s=15.0)

    # a rotation gone wrong (a key that is not the certificate's): the last good one goes on serving
    (tmp_path / "secret.yaml").write_text(secret_yaml("llm", KeyPair(self_signed().key_pem, second.cert_pem)))

    async def said() -> bool:
        async with http.get(f"{up.admin_url}/status") as response:
            entries = (await response.json())["resources"]
        [listener] = [e for e in entries if e["kind"] == "Gateway" and e.get("sectionName") == "llm"]
        refs = {c["type"]: c for c in listener["conditions"]}["ResolvedRefs"]
        return "serving the last good certificate" in refs["message"]

    await wait_until(said, "the broken Secret reported", timeout_s=15.0)
    for _ in range(3):
        assert (await complete(second))[0] == 200
        await asyncio.sleep(0.1)


async def test_http_and_https_on_80_and_443_bind_above_1023_with_the_offset(
    tmp_path: Path, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    # the gateway chart's container runs without privileges: 443 is bound at 443 + the offset
    # (Envoy Gateway's convention), 80 (the lowest) at --port; the Service maps them back
    port = free_port()
    fleet = await sim_fleet(start_fleet, "127.0.5.21", port, "--model", "base")
    pair = self_signed((HOST,))
    https_port = free_port()
    (tmp_path / "gateway.yaml").write_text("""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: kvgate
  listeners:
    - {name: http, port: 80, protocol: HTTP}
    - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: llm}]}}
""")
    (tmp_path / "secret.yaml").write_text(secret_yaml("llm", pair))
    (tmp_path / "pool.yaml").write_text(pool_yaml("pool", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (tmp_path / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: llm}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref("pool")}]}}]
""")
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0,
                            privileged_port_offset=https_port - 443))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        body = {"model": "base", "prompt": "hi", "max_tokens": 2}
        async with http.post(f"{up.url}/v1/completions", json=body) as plain:
            assert plain.status == 200
        async with http.post(f"https://127.0.0.1:{https_port}/v1/completions", json=body,
                             ssl=client_context(pair), server_hostname=HOST) as secure:
            assert secure.status == 200, await secure.text()
    finally:
        await up.stop()
