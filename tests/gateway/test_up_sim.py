"""``kvgate up --sim N``'s fleet: how the replicas are spread over simulator processes."""

from __future__ import annotations

from kvgate.gateway.up_sim import nth_host, process_shares


def test_replicas_are_spread_in_contiguous_even_runs() -> None:
    roles = ("prefill",) * 3 + ("decode",) * 4
    assert process_shares(roles, 1) == [(0, roles)]
    assert process_shares(roles, 3) == [(0, ("prefill",) * 3), (3, ("decode",) * 2), (5, ("decode",) * 2)]
    assert process_shares(("both",) * 2, 5) == [(0, ("both",)), (1, ("both",))]  # never an empty process
    assert process_shares(("both",) * 2, 0) == [(0, ("both",) * 2)]


def test_each_process_starts_at_its_first_replicas_address() -> None:
    assert nth_host("127.0.1.1", 0) == "127.0.1.1"
    assert nth_host("127.0.1.250", 10) == "127.0.2.4"
