"""``--workers auto``: how many picker processes a machine gets."""

from __future__ import annotations

import argparse
from pathlib import Path

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


def test_a_containers_cpu_limit_bounds_the_cores(tmp_path: Path) -> None:
    from kvgate.gateway.picker.workers import available_cpus

    cpu_max = tmp_path / "cpu.max"
    unbounded = available_cpus(tmp_path / "absent")
    cpu_max.write_text("max 100000\n")
    assert available_cpus(cpu_max) == unbounded
    cpu_max.write_text("250000 100000\n")  # a limit of 2.5 cores: 3
    assert available_cpus(cpu_max) == min(unbounded, 3)
    cpu_max.write_text("50000 100000\n")  # half a core: still one
    assert available_cpus(cpu_max) == 1
