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
