"""What `kvgate up --kubernetes` takes from the Pod it runs in: its namespace, the addresses it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.gateway.controlplane.kubernetes.client import own_namespace
from kvgate.gateway.up_cli import build_parser
from kvgate.gateway.up_options import UpOptions


def test_own_namespace_prefers_the_downward_api_then_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    mounted = tmp_path / "namespace"
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert own_namespace(mounted) is None  # outside a cluster
    mounted.write_text("infra\n", encoding="utf-8")
    assert own_namespace(mounted) == "infra"
    monkeypatch.setenv("POD_NAMESPACE", "gateways")
    assert own_namespace(mounted) == "gateways"


def test_gateway_addresses_default_to_the_bound_host_unless_it_is_a_wildcard() -> None:
    assert UpOptions(host="10.0.0.7").status_addresses == ("10.0.0.7",)
    assert UpOptions(host="0.0.0.0").status_addresses == ()
    assert UpOptions(host="::").status_addresses == ()
    given = UpOptions(host="0.0.0.0", gateway_addresses=("kvgate.infra.svc", "10.0.0.7"))
    assert given.status_addresses == ("kvgate.infra.svc", "10.0.0.7")


def test_the_command_line_carries_lease_namespace_and_addresses() -> None:
    args = build_parser().parse_args([
        "--kubernetes", "--lease-namespace", "infra",
        "--gateway-address", "kvgate.infra.svc", "--gateway-address", "10.0.0.7",
    ])
    assert args.lease_namespace == "infra"
    assert args.gateway_address == ["kvgate.infra.svc", "10.0.0.7"]
