"""A burst of 2,000 clients at once through ``kvgate up --sim 4``: none of their requests fails.

Before the picker's gRPC server queued what Envoy opened (``extproc.server.MAX_PENDING_STREAMS``),
gRPC's default pending-stream limits reset 3-10 % of such a burst's ext_proc streams and Envoy
answered those requests 503 ``endpoint_picker_unavailable``. ``bench/results/burst.md`` records the
same burst with each process's CPU.
"""

from __future__ import annotations

import pytest

from kvgate.bench.burst import burst, raise_open_files
from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.test_up_cli import KVGATE

pytestmark = pytest.mark.e2e

CONNECTIONS = 2000


@pytest.mark.timeout(240)
async def test_2000_concurrent_connections_lose_no_request() -> None:
    if raise_open_files(CONNECTIONS * 2 + 256) < CONNECTIONS + 64:
        pytest.fail("the open-file limit is too low for the burst (ulimit -n)")
    port = free_port()
    process = ChildProcess([
        *KVGATE, "up", "--port", str(port), "--admin-port", "0", "--sim", "4",
        "--sim-time-scale", "0.01", "--sim-hosts-from", "127.0.8.21",
    ], name="kvgate up")
    await process.start()
    try:
        await process.wait_for_line("kvgate ready:", 60.0)
        url = f"http://127.0.0.1:{port}"
        await burst(url, 8, stream=False)  # the replicas' connections and scrapes warm
        for stream in (False, True):
            result = await burst(url, CONNECTIONS, stream=stream)
            assert result.failed == 0, (stream, result.failures, process.tail())
    finally:
        await process.stop()
