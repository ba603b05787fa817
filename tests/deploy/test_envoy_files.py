"""deploy/envoy: the committed Envoy files equal what the builders generate, and real Envoy accepts them."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from kvgate.extproc.names import DESTINATION_HEADER, POOL_METADATA_KEY
from kvgate.gateway.picker.pools_file import load_pools
from kvgate.gateway.processes.envoy_process import find_envoy_binary

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ENVOY_DIR = DEPLOY / "envoy"
SIDECAR = "charts/kvgate-picker/files/envoy-sidecar.yaml"
ENVOY_CONFIGS = ("envoy/bootstrap-ads.yaml", "envoy/static-picker.yaml", SIDECAR)
"""The generated Envoy configurations, under deploy/ (the rest of deploy/envoy is the generator and a
pools file)."""


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvgate_deploy_envoy_generate", ENVOY_DIR / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rendered() -> dict[str, str]:
    rendered: dict[str, str] = _generator().render()
    return rendered


def test_committed_files_equal_the_generated_ones() -> None:
    rendered = _rendered()
    assert set(rendered) == set(ENVOY_CONFIGS)
    for name, text in rendered.items():
        path = DEPLOY / name
        assert path.exists(), f"{path} is missing: run python deploy/envoy/generate.py"
        assert path.read_text(encoding="utf-8") == text, (
            f"{path} differs from the builders' output: run python deploy/envoy/generate.py"
        )


def test_generator_check_mode_reports_drift(tmp_path: Path) -> None:
    main = _generator().main
    assert main(["--check"], tmp_path) == 1  # nothing written yet: everything is out of date
    assert main([], tmp_path) == 0
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.yaml"))
    assert written == sorted(ENVOY_CONFIGS)
    assert main(["--check"], tmp_path) == 0
    (tmp_path / "envoy" / "static-picker.yaml").write_text("# edited by hand\n", encoding="utf-8")
    assert main(["--check"], tmp_path) == 1


def _clusters(boot: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in boot["static_resources"]["clusters"]}


def test_ads_bootstrap_points_lds_and_cds_at_the_ads_cluster() -> None:
    boot = yaml.safe_load((ENVOY_DIR / "bootstrap-ads.yaml").read_text(encoding="utf-8"))
    dynamic = boot["dynamic_resources"]
    assert dynamic["lds_config"] == {"ads": {}, "resource_api_version": "V3"}
    assert dynamic["cds_config"] == {"ads": {}, "resource_api_version": "V3"}
    [service] = dynamic["ads_config"]["grpc_services"]
    xds = _clusters(boot)[service["envoy_grpc"]["cluster_name"]]
    [endpoint] = xds["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18000}
    assert "listeners" not in boot["static_resources"]


def test_static_bootstrap_routes_through_the_picker_of_a_pool_of_the_pools_file() -> None:
    boot = yaml.safe_load((ENVOY_DIR / "static-picker.yaml").read_text(encoding="utf-8"))
    pools = load_pools(ENVOY_DIR / "pools-local.yaml")
    [listener] = boot["static_resources"]["listeners"]
    [hcm] = listener["filter_chains"][0]["filters"]
    filters = [f["name"] for f in hcm["typed_config"]["http_filters"]]
    assert "envoy.filters.http.ext_proc" in filters
    assert filters[-1] == "envoy.filters.http.router"
    routes = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    named: set[str] = set()
    clusters = _clusters(boot)
    for route in routes:
        enabled = route["typed_per_filter_config"]["envoy.filters.http.ext_proc"]  # a FilterConfig
        override = enabled["config"]["overrides"]
        [metadata] = [m for m in override["grpc_initial_metadata"] if m["key"] == POOL_METADATA_KEY]
        named.add(metadata["value"])
        cluster = clusters[route["route"]["cluster"]]
        assert cluster["type"] == "ORIGINAL_DST"
        assert cluster["original_dst_lb_config"]["http_header_name"] == DESTINATION_HEADER
    assert named, "no route names a pool to the picker"
    assert named <= {pool.name for pool in pools.pools}
    ext_proc = clusters["kvgate_ext_proc"]
    [picker] = ext_proc["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert picker["endpoint"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9002}


@pytest.mark.e2e
@pytest.mark.parametrize("name", ENVOY_CONFIGS)
async def test_envoy_validates_the_file(name: str) -> None:
    path = DEPLOY / name
    process = await asyncio.create_subprocess_exec(
        str(find_envoy_binary()), "--mode", "validate", "-c", str(path), "--log-level", "warn",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output.decode(errors="replace")
    assert f"configuration '{path}' OK" in output.decode(errors="replace")


def test_the_charts_sidecar_sends_every_path_through_the_picker_naming_no_pool() -> None:
    """The kvgate-picker chart's standalone gateway: the picker serves its one pool, whatever the
    name ``--endpoint-selector`` gave it, so Envoy names none (``PoolBackend.announced``)."""
    boot = yaml.safe_load((DEPLOY / SIDECAR).read_text(encoding="utf-8"))
    [listener] = boot["static_resources"]["listeners"]
    assert listener["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 8081}
    [hcm] = listener["filter_chains"][0]["filters"]
    [route] = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert route["match"] == {"prefix": "/"}
    enabled = route["typed_per_filter_config"]["envoy.filters.http.ext_proc"]
    assert "grpc_initial_metadata" not in enabled["config"]["overrides"]
    clusters = _clusters(boot)
    pool = clusters[route["route"]["cluster"]]
    assert pool["original_dst_lb_config"]["http_header_name"] == DESTINATION_HEADER
    [picker] = clusters["kvgate_ext_proc"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert picker["endpoint"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9002}
    assert "transport_socket" in clusters["kvgate_ext_proc"]  # (the picker serves TLS by default)
