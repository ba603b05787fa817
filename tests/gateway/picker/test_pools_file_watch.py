"""``kvgate picker --pools FILE --watch``: the file is applied when its content changes, not when
something else in its folder does (the picker's own log there made each reload cause the next), and
an error is said once, and its end."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvgate.gateway.picker.cli import PoolsFileApplier
from kvgate.gateway.picker.pools_file import PoolSpec

GOOD = 'pools:\n  - name: default/llama\n    endpoints: ["127.0.0.1:8000"]\n'


def test_a_pools_file_is_applied_when_it_changes_and_its_errors_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(GOOD)
    applied: list[list[str]] = []

    def apply(specs: Sequence[PoolSpec], default: str | None) -> None:
        applied.append([spec.name for spec in specs])

    applier = PoolsFileApplier(path, apply)
    applier.changed()
    applier.changed()  # the folder changed, the file did not (a log written beside it)
    assert applied == [["default/llama"]]
    with caplog.at_level(logging.WARNING):
        path.write_text("pools: [")
        for _ in range(3):
            applier.changed()
        path.write_text(GOOD.replace("llama", "mistral"))
        applier.changed()
        applier.changed()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("keeping the last good pools:")
    assert said[1] == f"pools file valid again: {path}"
    assert applied == [["default/llama"], ["default/mistral"]]
