"""The worker supervisor's pure parts (the processes themselves: tests/e2e/test_picker_workers.py)."""

from __future__ import annotations

from gateway.workers import WorkerPlan, worker_base_command


def test_the_worker_command_drops_what_the_supervisor_sets_per_worker() -> None:
    argv = ["--pools", "p.yaml", "--grpc-port", "9002", "--admin-port=9090", "--workers", "4",
            "--redis", "redis://x", "--reuse-port", "--log-level", "INFO"]
    base = worker_base_command(argv)
    assert base[-4:] == ("--pools", "p.yaml", "--log-level", "INFO")


def test_each_worker_gets_the_shared_port_its_own_admin_port_and_the_redis_url() -> None:
    plan = WorkerPlan(workers=3, host="127.0.0.1", grpc_port=9002, admin_port=9090, base_command=("kvgate",))
    command = plan.command(2, "redis://127.0.0.1:7000/0")
    assert command[command.index("--grpc-port") + 1] == "9002"
    assert command[command.index("--admin-port") + 1] == "9092"
    assert command[command.index("--redis") + 1] == "redis://127.0.0.1:7000/0"
    assert "--reuse-port" in command
    assert command[command.index("--workers") + 1] == "1"
    assert WorkerPlan(2, "h", 1, 0, ()).command(1, "r")[-3] == "0"  # admin 0 stays "any free"
