"""The picker's prefill client over real HTTP on loopback: an answer in several chunks is read whole,
and every failure becomes a PrefillDone without params (the request then goes to decode unchanged)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from kvgate.extproc.actions import RunPrefill
from kvgate.extproc.prefill_client import PrefillClient
from kvgate.gateway.picker.tls import self_signed

PARAMS = {"do_remote_prefill": True, "remote_block_ids": list(range(3000)), "remote_engine_id": "e"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


def step(address: str) -> RunPrefill:
    return RunPrefill(address, "/v1/completions", b'{"prompt": "x"}', (("authorization", "Bearer k"),))


async def test_an_answer_in_several_chunks_is_read_whole(serve: Callable[[Handler], Awaitable[str]]) -> None:
    seen: dict[str, str] = {}

    async def chunked(request: web.Request) -> web.StreamResponse:
        seen["authorization"] = request.headers.get("authorization", "")
        body = json.dumps({"choices": [], "kv_transfer_params": PARAMS}).encode()
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        for at in range(0, len(body), 4096):  # as a big answer arrives: in pieces
            await response.write(body[at : at + 4096])
            await asyncio.sleep(0.002)
        await response.write_eof()
        return response

    client = PrefillClient()
    try:
        done = await client.run(step(await serve(chunked)))
    finally:
        await client.close()
    assert done.ok, done.error
    assert done.params == PARAMS
    assert seen["authorization"] == "Bearer k"


async def test_failures_give_no_params_and_one_warning(
    serve: Callable[[Handler], Awaitable[str]], caplog: pytest.LogCaptureFixture
) -> None:
    async def error(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "boom"}}, status=500)

    async def no_params(request: web.Request) -> web.StreamResponse:
        return web.json_response({"choices": []})

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.json_response({"kv_transfer_params": PARAMS})

    client = PrefillClient(timeout_s=0.2)
    try:
        outcomes = [await client.run(step(await serve(handler))) for handler in (error, no_params, slow)]
        outcomes.append(await client.run(step("127.0.0.1:1")))  # refused
    finally:
        await client.close()
    assert [o.ok for o in outcomes] == [False] * 4
    assert outcomes[0].error == "status 500"
    assert "kv_transfer_params" in outcomes[1].error
    assert outcomes[2].error == "timed out"
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # the others within 5 s are counted in the next one
    assert "its decode endpoint prefills instead" in warnings[0].getMessage()


async def test_a_request_the_endpoint_refuses_is_the_requests_fault_and_no_warning(
    serve: Callable[[Handler], Awaitable[str]], caplog: pytest.LogCaptureFixture
) -> None:
    async def too_long(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "maximum context length"}}, status=400)

    async def busy(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "busy"}}, status=429)

    client = PrefillClient()
    try:
        refused = await client.run(step(await serve(too_long)))
        full = await client.run(step(await serve(busy)))
    finally:
        await client.close()
    assert (refused.ok, refused.request_fault, refused.error) == (False, True, "status 400")
    assert (full.ok, full.request_fault) == (False, False)  # 429: the endpoint is full, its fault
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # the 429's; the refused request's is not an endpoint's problem
    assert "status 429" in warnings[0]


async def test_a_model_server_serving_https_is_asked_over_tls(tmp_path: Path) -> None:
    pair = self_signed(("localhost",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def answer(request: web.Request) -> web.StreamResponse:
        assert request.secure
        return web.json_response({"choices": [], "kv_transfer_params": PARAMS})

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_side).start()
    address = f"127.0.0.1:{runner.addresses[0][1]}"
    verified = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
    verified.check_hostname = False  # (as the picker's: pods are reached by IP)
    client = PrefillClient()
    try:
        plain = await client.run(step(address))  # plain HTTP to a TLS port: a failure, no params
        done = await client.run(dataclasses.replace(step(address), tls=verified))
    finally:
        await client.close()
        await runner.cleanup()
    assert not plain.ok
    assert done.ok, done.error
    assert done.params == PARAMS
