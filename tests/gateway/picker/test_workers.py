"""The worker supervisor's pure parts (the processes themselves: tests/e2e/test_picker_workers.py)."""

from __future__ import annotations

import pytest

from kvgate.gateway.picker.workers import WorkerPlan, worker_base_command


def test_the_worker_command_drops_what_the_supervisor_sets_per_worker() -> None:
    argv = ["--pools", "p.yaml", "--grpc-port", "9002", "--admin-port=9090", "--workers", "4",
            "--redis", "redis://x", "--reuse-port", "--log-level", "INFO"]
    base = worker_base_command(argv)
    assert base[-4:] == ("--pools", "p.yaml", "--log-level", "INFO")


def test_each_worker_gets_the_shared_port_its_own_admin_port_and_the_redis_url() -> None:
    plan = WorkerPlan(workers=3, grpc_port=9002, admin_port=9090, base_command=("kvgate",))
    command = plan.command(2, "redis://127.0.0.1:7000/0")
    assert command[command.index("--grpc-port") + 1] == "9002"
    assert command[command.index("--admin-port") + 1] == "9092"
    assert command[command.index("--redis") + 1] == "redis://127.0.0.1:7000/0"
    assert "--reuse-port" in command
    assert command[command.index("--workers") + 1] == "1"
    other = WorkerPlan(2, 1, 0, (), own_ports=(7001, 7002)).command(1, "r")
    assert other[other.index("--admin-port") + 1] == "0"  # admin 0 stays "any free"
    assert other[other.index("--own-port") + 1] == "7002"


def test_up_workers_write_the_pool_table_whole_and_skip_an_empty_one() -> None:
    from kvgate.gateway.picker.pools_file import PoolSpec, load_pools
    from kvgate.gateway.picker.workers import UpWorkers

    workers = UpWorkers(2, scrape_interval=0.05, stale_after=0.2)
    try:
        assert len(set(workers.addresses)) == 2
        workers.write_pools([], None)
        assert not workers.pools_path.exists()
        spec = PoolSpec(name="default/llama", endpoints=("127.0.0.1:8000",))
        workers.write_pools([spec], "default/llama")
        loaded = load_pools(workers.pools_path)
        assert loaded.pools == (spec,)
        assert loaded.default_pool == "default/llama"
        assert not list(workers.directory.glob("*.tmp"))
    finally:
        import shutil

        shutil.rmtree(workers.directory)


def test_kvgate_ups_loop_reaches_its_picker_workers() -> None:
    from kvgate.gateway.picker.workers import UpWorkers
    from kvgate.gateway.up_cli import build_parser, options_from_args

    options = options_from_args(build_parser().parse_args(["--workers", "3", "--loop", "asyncio"]))
    assert options.loop == "asyncio"
    assert options_from_args(build_parser().parse_args([])).loop == "auto"
    workers = UpWorkers(2, scrape_interval=0.05, stale_after=0.2, loop=options.loop)
    try:
        command = workers.plan.command(0, "redis://127.0.0.1:7000/0")
        assert command[command.index("--loop") + 1] == "asyncio"
    finally:
        import shutil

        shutil.rmtree(workers.directory)


def test_the_session_pins_bound_reaches_every_picker_and_bounds_their_state() -> None:
    import shutil

    from kvgate.gateway.picker.cli import build_parser as picker_parser
    from kvgate.gateway.picker.cli import settings_from_args
    from kvgate.gateway.picker.shared_state.runtime import SharingRuntime
    from kvgate.gateway.picker.workers import UpWorkers
    from kvgate.gateway.up_cli import build_parser, options_from_args
    from kvgate.policies.state import DEFAULT_MAX_SESSIONS

    options = options_from_args(build_parser().parse_args(["--max-session-pins", "2"]))
    assert options.max_session_pins == 2
    assert options_from_args(build_parser().parse_args([])).max_session_pins == DEFAULT_MAX_SESSIONS
    workers = UpWorkers(1, scrape_interval=0.05, stale_after=0.2, max_session_pins=2)
    try:
        command = workers.plan.command(0, "redis://127.0.0.1:7000/0")
        args = picker_parser().parse_args(list(command[command.index("--pools"):]))
        assert settings_from_args(args, None).max_session_pins == 2
    finally:
        shutil.rmtree(workers.directory)
    with pytest.raises(SystemExit):
        picker_parser().parse_args(["--max-session-pins", "0"])
    state = SharingRuntime(max_sessions=2).state_for("default/llama")
    for session in ("a", "b", "c"):
        state.session_set(session, "10.0.0.1:8000")
    assert [state.session_get(s) for s in ("a", "b", "c")] == [None, "10.0.0.1:8000", "10.0.0.1:8000"]
