"""``--workers auto``: how many picker processes a machine gets."""

from __future__ import annotations

import argparse

import pytest

from kvgate.gateway.picker.workers import auto_workers, resolve_workers, workers_argument


def test_one_picker_process_per_two_cores_up_to_eight_when_they_can_share() -> None:
    assert [auto_workers(cpus, True) for cpus in (1, 2, 3, 4, 16, 64)] == [1, 1, 1, 2, 8, 8]
    assert auto_workers(16, False) == 1  # no Redis to share their state through: one process


def test_the_argument_takes_a_count_or_auto() -> None:
    assert workers_argument("4") == 4
    assert workers_argument("auto") == 0
    for bad in ("0", "-1", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            workers_argument(bad)
    assert resolve_workers(3, None) == 3
    assert resolve_workers(0, "redis://127.0.0.1:6379/0") >= 1


def test_body_sizes_read_in_bytes_or_binary_units() -> None:
    from kvgate.gateway.picker.workers import byte_size

    assert byte_size("1024") == 1024
    assert byte_size("32MiB") == 32 * 1024 * 1024
    assert byte_size("2 GiB") == 2 * 1024**3
    for bad in ("0", "32MB", "-1", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            byte_size(bad)
