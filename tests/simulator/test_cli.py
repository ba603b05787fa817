"""``kvgate sim`` as a subprocess: starts, prints the ready line, serves, stops cleanly on a signal."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from kvgate.simulator.cli import build_parser, fleet_config, main
from kvgate.simulator.fleet import parse_ready_line

pytestmark = pytest.mark.e2e  # starts processes (Envoy / the simulator)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@contextmanager
def running_sim(args: Sequence[str]) -> Iterator[tuple[subprocess.Popen[str], list[str], list[str]]]:
    """Starts ``python -m kvgate.gateway.cli sim ARGS``; yields (process, urls, lines before ready)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvgate.gateway.cli", "sim", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        urls = None
        for line in proc.stdout:
            urls = parse_ready_line(line.rstrip("\n"))
            if urls is not None:
                break
            lines.append(line.rstrip("\n"))
        assert urls is not None, (lines, proc.stderr.read() if proc.stderr else "")
        yield proc, urls, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def post_json(url: str, body: object) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, object] = json.load(response)
        return result


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sim_serves_and_stops_on_signal(sig: signal.Signals) -> None:
    args = [
        "--replicas",
        "2",
        "--port",
        "0",
        "--time-scale",
        "0.01",
        "--admin-port",
        "0",
        "--loras",
        "a,b",
        "--replica",
        "1:num_gpu_blocks=512,slowdown=1.5",
    ]
    with running_sim(args) as (proc, urls, lines):
        assert len(urls) == 2
        assert lines[0] == f"kvgate-sim replica 0 {urls[0]}"
        assert lines[1] == f"kvgate-sim replica 1 {urls[1]}"
        assert lines[2].startswith("kvgate-sim admin http://127.0.0.1:")
        result = post_json(urls[1] + "/v1/completions", {"model": "b", "prompt": "hello", "max_tokens": 3})
        assert result["model"] == "b"
        with urllib.request.urlopen(urls[1] + "/metrics", timeout=10) as response:
            assert 'num_gpu_blocks="512"' in response.read().decode()
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0


def test_hosts_from_serves_each_replica_on_its_own_address() -> None:
    port = free_port("127.0.1.1")
    with running_sim(
        ["--replicas", "2", "--port", str(port), "--hosts-from", "127.0.1.1", "--time-scale", "0.01"]
    ) as (proc, urls, _):
        assert urls == [f"http://127.0.1.1:{port}", f"http://127.0.1.2:{port}"]
        for url in urls:
            result = post_json(url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
            assert result["object"] == "text_completion"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


def test_port_in_use_exits_1() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "kvgate.simulator", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1
    assert "cannot listen" in done.stderr


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--replica", "5:num_gpu_blocks=1"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["--replica", "0:colour=blue"])
    with pytest.raises(SystemExit):
        main(["--profile", "no-such-profile"])
    assert "error" in capsys.readouterr().err


def test_overrides_reach_replica_configs() -> None:
    args = build_parser().parse_args(
        [
            "--replicas",
            "3",
            "--num-gpu-blocks",
            "1000",
            "--engine",
            "sglang",
            "--replica",
            "2:num_gpu_blocks=10,error_rate=0.5,loras=x+y",
            "--replica",
            "0:enable_prefix_caching=false",
        ]
    )
    config = fleet_config(args)
    assert [r.engine.num_gpu_blocks for r in config.replicas] == [1000, 1000, 10]
    assert config.replicas[2].faults.error_rate == 0.5
    assert config.replicas[2].engine.served_loras == ("x", "y")
    assert config.replicas[0].engine.enable_prefix_caching is False
    assert {r.dialect for r in config.replicas} == {"sglang"}


def test_prefill_and_decode_counts_make_a_disaggregated_fleet() -> None:
    args = build_parser().parse_args(["--prefill", "2", "--decode", "3", "--replicas", "1",
                                      "--kv-bandwidth-gbs", "12.5", "--kv-latency-ms", "5",
                                      "--replica", "4:role=both"])
    config = fleet_config(args)
    assert [r.role for r in config.replicas] == ["prefill", "prefill", "decode", "decode", "both", "both"]
    kv = config.replicas[0].kv_transfer
    assert (kv.bandwidth_gbs, kv.latency_s) == (12.5, 0.005)
    roles = fleet_config(build_parser().parse_args(["--replicas", "2", "--role", "decode"])).replicas
    assert [r.role for r in roles] == ["decode", "decode"]


@pytest.mark.parametrize("argv", [["--prefill", "1", "--role", "decode"], ["--prefill", "-1"],
                                  ["--replica", "0:role=leader"], ["--kv-bandwidth-gbs", "0"]])
def test_bad_disaggregation_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_ready_lines_name_each_replica_role() -> None:
    with running_sim(["--prefill", "1", "--decode", "1", "--port", "0", "--time-scale", "0.01"]) as (
        proc, urls, lines,
    ):
        assert lines == [f"kvgate-sim replica 0 {urls[0]} role=prefill",
                         f"kvgate-sim replica 1 {urls[1]} role=decode"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
