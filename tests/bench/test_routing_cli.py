"""``kvgate bench`` as a user meets it: what is missing is said before anything runs, and results
go to a directory of the user's."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvgate.bench import routing


def test_kvgate_bench_writes_to_a_user_directory_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def main(argv: Sequence[str] | None = None) -> int:
        seen.append(list(argv or ()))
        return 0

    monkeypatch.setattr(routing, "main", main)
    routing.kvgate_bench(["--quick"])
    routing.kvgate_bench(["--quick", "--results", "mine"])
    assert seen == [["--quick", "--results", "kvgate-bench-results"], ["--quick", "--results", "mine"]]


def test_missing_bench_tools_are_named_at_once(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(routing, "missing_tools", lambda contenders: ["matplotlib", "vllm-router"])
    assert routing.main(["--quick", "--results", "unused"]) == 2
    assert "matplotlib, vllm-router missing: pip install 'kvgate[bench]'" in capsys.readouterr().err


def test_a_larger_fleet_keeps_the_workload_or_scales_its_prompt_groups_with_it() -> None:
    parser = routing.build_parser()
    plain = routing.workload_spec("shared-prefix-exceed", parser.parse_args(["--replicas", "256"]), 64)
    assert (plain.name, plain.fleet.replicas, plain.groups) == ("shared-prefix-exceed-r256", 256, 256)
    assert "at 256 the caches hold 614,400 blocks" in plain.description
    scaled = routing.workload_spec(
        "shared-prefix-exceed", parser.parse_args(["--replicas", "256", "--scale-groups"]), 64)
    assert (scaled.name, scaled.groups) == ("shared-prefix-exceed-r256-scaled", 8192)
    same = routing.workload_spec("shared-prefix-exceed", parser.parse_args(["--scale-groups"]), 64)
    assert (same.name, same.groups) == ("shared-prefix-exceed", 256)  # nothing to scale without --replicas
