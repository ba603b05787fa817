"""Ports chosen in advance for several processes are distinct."""

from __future__ import annotations

import itertools

import pytest

from kvgate.gateway.processes import envoy_process
from kvgate.gateway.processes.envoy_process import free_ports


def test_two_draws_that_meet_give_two_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = itertools.chain([21000, 21000, 21001, 21002, 21002, 21003], itertools.count(22000))
    monkeypatch.setattr(envoy_process, "free_port", lambda host="127.0.0.1": next(draws))
    assert free_ports(3) == (21000, 21001, 21002)
    assert free_ports(1, taken=(21002, 21003)) == (22000,)
