"""Ports for tests' servers (loopback, free at the time of asking)."""

from __future__ import annotations

import socket

from kvgate.gateway.processes.envoy_process import free_port


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P with P and P + 1 both free on ``host`` now: a KV-event publisher and its replay
    socket (one free port's successor was taken now and then: a flaky bind)."""
    for _ in range(200):
        port = free_port(host)
        if port >= 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no two consecutive free ports on {host}")
