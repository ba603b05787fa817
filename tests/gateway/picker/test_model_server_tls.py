"""The picker's TLS to model servers, over real TLS handshakes on loopback: a BackendTLSPolicy's
hostname is named in every handshake (SNI) although pods are dialled by IP, and checked against
the certificate; its CA certificates are the only trust; a pools file takes the same settings."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvgate.gateway.picker.model_server_tls import ClientTls
from kvgate.gateway.picker.pools_file import ModelServerTlsSpec
from kvgate.gateway.picker.tls import self_signed

HOST = "vllm.models.svc"
PAIR = self_signed((HOST,))


@pytest.fixture
async def https_server(tmp_path: Path) -> AsyncIterator[tuple[int, list[str | None]]]:
    """A loopback HTTPS server whose certificate names ``HOST`` (not 127.0.0.1); the SNI names
    it was asked for."""
    (tmp_path / "tls.crt").write_bytes(PAIR.cert_pem)
    (tmp_path / "tls.key").write_bytes(PAIR.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    names: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: names.append(name)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, names
    finally:
        await runner.cleanup()


async def _handshake(tls: ClientTls, port: int) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls.context())
    writer.close()
    await writer.wait_closed()


async def test_the_hostname_is_named_and_checked_though_the_pod_is_dialled_by_ip(
        https_server: tuple[int, list[str | None]]) -> None:
    port, names = https_server
    await _handshake(ClientTls(ca_data=PAIR.cert_pem.decode(), hostname=HOST, check_hostname=True), port)
    assert names == [HOST]
    async with aiohttp.ClientSession() as session:  # (the /v1/models poll's client)
        tls = ClientTls(ca_data=PAIR.cert_pem.decode(), hostname=HOST, check_hostname=True)
        async with session.get(f"https://127.0.0.1:{port}/metrics", ssl=tls.context()) as response:
            assert await response.text() == "ok"
    assert names[-1] == HOST


async def test_a_certificate_for_another_name_or_from_another_ca_is_refused(
        https_server: tuple[int, list[str | None]]) -> None:
    port, _ = https_server
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        await _handshake(ClientTls(ca_data=PAIR.cert_pem.decode(), hostname="other.example",
                                   check_hostname=True), port)
    other_ca = self_signed((HOST,)).cert_pem.decode()
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(ClientTls(ca_data=other_ca, hostname=HOST, check_hostname=True), port)
    # names left to Envoy (a policy's subjectAltNames): the chain alone is checked
    await _handshake(ClientTls(ca_data=PAIR.cert_pem.decode(), hostname="other.example"), port)
    # no CA at all: encrypted, not verified (the Inference Extension picker's default)
    await _handshake(ClientTls(), port)


def test_a_pools_file_takes_the_policy_settings_and_refuses_what_is_not_pem() -> None:
    spec = ModelServerTlsSpec.model_validate(
        {"caCertificates": PAIR.cert_pem.decode(), "hostname": HOST})
    assert spec.client() == ClientTls(None, PAIR.cert_pem.decode(), HOST, True)
    with pytest.raises(ValueError, match="caCertificates cannot be loaded"):
        ModelServerTlsSpec.model_validate({"caCertificates": "not a certificate"})
