"""What a client can send ``kvgate up`` by mistake or on purpose, through real Envoy: every bad input
gets an OpenAI-style JSON error with the right status, and none of them hurts the gateway.

:data:`BAD_INPUTS` is the table ``docs/bad-input.md`` shows (``test_the_docs_table_is_this_table``
keeps the two equal).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up_options import EXAMPLE_MODEL
from tests.e2e.picker_harness import KVGATE, wait_until

pytestmark = pytest.mark.e2e
IN_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")  # the module's one kvgate up

DOCS_TABLE = Path(__file__).parents[2] / "docs" / "bad-input.md"
REQUEST_TIMEOUT_S = 3
HEADERS_TIMEOUT_S = 2


@dataclass(frozen=True)
class BadInput:
    """One row of the table: what is sent, and the status and error code that come back."""

    what: str
    status: int
    code: str
    body: bytes = b""
    path: str = "/v1/completions"
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = field(default=(("content-type", "application/json"),))


def completion(**fields: object) -> bytes:
    return json.dumps({"model": EXAMPLE_MODEL, "prompt": "hi", "max_tokens": 2, **fields}).encode()


JSON = (("content-type", "application/json"),)


def extra_headers(count: int) -> tuple[tuple[str, str], ...]:
    return (*JSON, *((f"x-extra-{index}", "v") for index in range(count)))


BAD_INPUTS = (
    BadInput("a model name with a NUL and a CR", 400, "invalid_model_name", completion(model="a\u0000b\r")),
    BadInput("a model name with a newline", 400, "invalid_model_name", completion(model="a\nb")),
    BadInput("a 100 KB model name", 400, "invalid_model_name", completion(model="m" * 100_000)),
    BadInput("a model no replica serves", 404, "model_not_found", completion(model="no-such-model")),
    BadInput("a model server's admin API: POST /v1/load_lora_adapter", 404, "unknown_url",
             json.dumps({"lora_name": "evil", "lora_path": "/tmp"}).encode(), path="/v1/load_lora_adapter"),
    BadInput("a path outside the inference API: GET /v1/foo", 404, "unknown_url",
             method="GET", path="/v1/foo", headers=()),
    BadInput("a served path with a method it does not take: GET /v1/completions", 405, "method_not_allowed",
             method="GET", headers=()),
    BadInput("a WebSocket upgrade of another path: POST /v1/chat/completions with Upgrade: websocket", 400,
             "bad_request", completion(), path="/v1/chat/completions",
             headers=(*JSON, ("upgrade", "websocket"), ("connection", "Upgrade"))),
    BadInput("GET /v1/realtime without Upgrade: websocket (a realtime session is a WebSocket)", 400,
             "bad_request", method="GET", path="/v1/realtime", headers=()),
    BadInput("x-gateway-model-name-rewrite on a pool that does not take it (kvgate.io/model-rewrite-header)",
             400, "bad_request", completion(), headers=(*JSON, ("x-gateway-model-name-rewrite", "other"))),
    BadInput("95 extra headers (no room left for the gateway's own)", 431, "request_header_fields_too_large",
             completion(), headers=extra_headers(95)),
    BadInput("120 extra headers (over Envoy's limit of 100)", 431, "request_header_fields_too_large",
             completion(), headers=extra_headers(120)),
    BadInput("a 70 KB header (over Envoy's 60 KiB)", 431, "request_header_fields_too_large",
             completion(), headers=(*JSON, ("x-big", "b" * 70_000))),
    BadInput("a prompt with an unpaired UTF-16 surrogate", 400, "bad_request",
             b'{"model": "%s", "prompt": "\\ud800", "max_tokens": 2}' % EXAMPLE_MODEL.encode()),
    BadInput("a 9 MB body (over the 8 MiB limit)", 413, "payload_too_large",
             completion(prompt="p" * 9 * 1024 * 1024)),
    BadInput("a 6 MB body that is not JSON", 400, "invalid_json", b"x" * 6 * 1024 * 1024),
)


@dataclass(frozen=True)
class Gateway:
    url: str
    admin: str
    process: ChildProcess
    access_log: Path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    port = free_port()
    access_log = tmp_path_factory.mktemp("access") / "access.log"
    process = ChildProcess([
        *KVGATE, "up", "--port", str(port), "--admin-port", "0", "--sim", "2",
        "--sim-time-scale", "0.01", "--sim-hosts-from", "127.0.8.31",
        "--request-timeout", str(REQUEST_TIMEOUT_S), "--request-headers-timeout", str(HEADERS_TIMEOUT_S),
        "--access-log", str(access_log),
    ], name="kvgate up")
    await process.start()
    try:
        await process.wait_for_line("kvgate ready:", 60.0)
        admin = (await process.wait_for_line(r"\s+kvgate status --admin (\S+)$", 10.0)).group(1)
        up = Gateway(f"http://127.0.0.1:{port}", admin, process, access_log)
        async with aiohttp.ClientSession() as http:

            async def replicas_polled() -> bool:
                async with http.post(f"{up.url}/v1/completions", data=completion(model="no-such-model"),
                                     headers={"content-type": "application/json"}) as response:
                    return response.status == 404 and b"model_not_found" in await response.read()

            await wait_until(replicas_polled, "the picker knows what the replicas serve", timeout_s=20.0)
        yield up
    finally:
        await process.stop()


async def send(http: aiohttp.ClientSession, url: str, case: BadInput) -> tuple[int, str, bytes]:
    async with http.request(case.method, f"{url}{case.path}", data=case.body, headers=list(case.headers),
                            timeout=aiohttp.ClientTimeout(total=30)) as response:
        return response.status, response.headers.get("content-type", ""), await response.read()


@IN_MODULE_LOOP
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[case.what for case in BAD_INPUTS])
async def test_bad_input_gets_an_openai_error_with_the_right_status(gateway: Gateway, case: BadInput) -> None:
    async with aiohttp.ClientSession() as http:
        status, content_type, body = await send(http, gateway.url, case)
        assert (status, content_type.split(";")[0]) == (case.status, "application/json"), body[:300]
        error = json.loads(body)["error"]
        assert error["code"] == case.code, error
        assert error["message"], error
        assert error["type"], error
        # and the gateway still serves
        async with http.post(f"{gateway.url}/v1/completions", data=completion(),
                             headers={"content-type": "application/json"}) as response:
            assert response.status == 200, await response.text()


def message(**fields: object) -> bytes:
    return json.dumps({"model": EXAMPLE_MODEL, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


ANTHROPIC_CASES = (  # (case, Anthropic's error type): Envoy's own replies and the picker's alike
    (BadInput("a 9 MB body", 413, "", message(system="s" * 9 * 1024 * 1024), path="/v1/messages"),
     "request_too_large"),
    # (not too many headers: Envoy's HTTP codec refuses them before the request, path included, is read)
    (BadInput("a model no replica serves", 404, "", message(model="no-such-model"), path="/v1/messages"),
     "not_found_error"),
    (BadInput("no messages", 400, "", message(messages=[]), path="/v1/messages"), "invalid_request_error"),
)


@IN_MODULE_LOOP
@pytest.mark.parametrize(("case", "kind"), ANTHROPIC_CASES, ids=[case.what for case, _ in ANTHROPIC_CASES])
async def test_bad_input_on_anthropics_messages_api_gets_anthropics_error(
    gateway: Gateway, case: BadInput, kind: str
) -> None:
    async with aiohttp.ClientSession() as http:
        status, content_type, body = await send(http, gateway.url, case)
    assert (status, content_type.split(";")[0]) == (case.status, "application/json"), body[:300]
    document = json.loads(body)
    assert document.get("type") == "error", document
    assert document["error"]["type"] == kind, document
    assert document["error"]["message"], document


def _random_name(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:  # plausible but unknown
        return f"model-{rng.getrandbits(48):x}"
    if kind == 1:  # control characters
        return "".join(rng.choice("ab\u0000\r\n\t\u007f\u0085") for _ in range(rng.randrange(1, 30)))
    if kind == 2:  # long
        return "x" * rng.randrange(257, 5000)
    return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(1, 40)))


@IN_MODULE_LOOP
async def test_metrics_stay_parseable_and_small_after_10000_random_model_names(gateway: Gateway) -> None:
    rng = random.Random(31)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.admin}/metrics") as response:
            before = len(await response.read())
        names = [_random_name(rng) for _ in range(10_000)]
        statuses: dict[int, int] = {}
        limit = asyncio.Semaphore(64)

        async def one(name: str) -> None:
            async with limit, http.post(f"{gateway.url}/v1/completions", data=completion(model=name),
                                        headers={"content-type": "application/json"}) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1

        await asyncio.gather(*(one(name) for name in names))
        assert set(statuses) <= {400, 404}, statuses
        async with http.get(f"{gateway.admin}/metrics") as response:
            page = (await response.read()).decode()
    families = list(text_string_to_metric_families(page))  # raises on a page Prometheus cannot read
    assert families
    assert len(page.encode()) - before < 100_000, (before, len(page.encode()))


def test_the_docs_table_is_this_table() -> None:
    rows = re.findall(r"^\| (.+?) \| (\d{3}) \| `(\w+)` \|$", DOCS_TABLE.read_text(), re.MULTILINE)
    assert rows == [(case.what, str(case.status), case.code) for case in BAD_INPUTS]


@IN_MODULE_LOOP
async def test_the_admin_api_loads_no_adapter_through_the_gateway(gateway: Gateway) -> None:
    load = next(case for case in BAD_INPUTS if case.path == "/v1/load_lora_adapter")
    async with aiohttp.ClientSession() as http:
        await send(http, gateway.url, load)
        async with http.get("http://127.0.8.31:8000/v1/models") as response:  # the first replica
            served = [model["id"] for model in (await response.json())["data"]]
    assert "evil" not in served


async def _stall(port: int, head: bytes) -> tuple[float, bytes]:
    """Send ``head`` and nothing more; the seconds until the gateway answers or closes, and what came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = asyncio.get_running_loop().time()
    writer.write(head)
    await writer.drain()
    try:
        answer = await asyncio.wait_for(reader.read(), REQUEST_TIMEOUT_S * 5)
    finally:
        writer.close()
    return asyncio.get_running_loop().time() - started, answer


@IN_MODULE_LOOP
async def test_clients_that_stall_are_answered_408_and_let_go(gateway: Gateway) -> None:
    port = int(gateway.url.rpartition(":")[2])
    body_stalls = [
        _stall(port, b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                     b"content-length: 100000\r\n\r\n{\"model\": ")
        for _ in range(20)
    ]
    header_stalls = [_stall(port, b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\n") for _ in range(5)]
    results = await asyncio.gather(*body_stalls, *header_stalls)
    for seconds, answer in results[:20]:  # the body never came: the whole-request timeout
        assert seconds < REQUEST_TIMEOUT_S + 3, seconds
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"request_timeout"' in answer, answer
    for seconds, _answer in results[20:]:  # the headers never ended: closed by the headers timeout
        assert seconds < HEADERS_TIMEOUT_S + 3, seconds


@IN_MODULE_LOOP
async def test_the_access_log_has_a_json_line_per_request_with_its_endpoints(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as http:
        headers = {"content-type": "application/json", "x-request-id": "logged-1"}
        async with http.post(f"{gateway.url}/v1/completions", data=completion(), headers=headers) as reply:
            assert reply.status == 200

        async def logged() -> bool:
            return "logged-1" in gateway.access_log.read_text()

        await wait_until(logged, "the request is in the access log", timeout_s=10.0)
    [line] = [json.loads(text) for text in gateway.access_log.read_text().splitlines() if "logged-1" in text]
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/completions", 200)
    assert line["model"] == EXAMPLE_MODEL
    assert line["upstream"] == line["picked"].split(",")[0]
    assert line["upstream"].startswith("127.0.8.")


@IN_MODULE_LOOP
async def test_a_wrong_method_names_the_right_one_and_a_cors_preflight_reaches_the_server(
    gateway: Gateway,
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/v1/chat/completions") as response:
            assert response.status == 405
            assert response.headers["allow"] == "POST"
        preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                     "access-control-request-headers": "authorization, content-type"}
        async with http.options(f"{gateway.url}/v1/chat/completions", headers=preflight) as response:
            assert response.status == 200, await response.text()  # the simulator's, as vLLM answers it
            assert response.headers["access-control-allow-origin"] == "*"
            assert "POST" in response.headers["access-control-allow-methods"]
            assert response.headers["access-control-allow-headers"] == "authorization, content-type"


@IN_MODULE_LOOP
async def test_an_http_1_0_client_is_served_with_or_without_a_host(gateway: Gateway) -> None:
    port = int(gateway.url.rpartition(":")[2])
    body = completion()
    for host in (b"host: gw\r\n", b""):  # ApacheBench sends one; HTTP/1.0 does not require it
        head = (b"POST /v1/completions HTTP/1.0\r\n" + host + b"content-type: application/json\r\n"
                b"content-length: %d\r\n\r\n" % len(body))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + body)
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.read(), 20)  # HTTP/1.0: the server closes when done
        finally:
            writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.split()[1] == b"200", answer[:300]
        assert json.loads(rest.partition(b"\r\n\r\n")[2])["usage"]["completion_tokens"] == 2
