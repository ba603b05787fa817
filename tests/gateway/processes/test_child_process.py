"""The one way kvgate starts and stops a child process (real processes: e2e)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from kvgate.gateway.processes.child_process import ChildProcess, ChildProcessError

pytestmark = pytest.mark.e2e


def _python(code: str) -> list[str]:
    return [sys.executable, "-u", "-c", code]


async def test_waits_for_a_line_then_stops_with_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = ChildProcess(
        _python("import time; print('starting'); print('ready port=4242'); time.sleep(60)"),
        name="sleeper", log_path=log,
    )
    async with child:
        match = await child.wait_for_line(r"ready port=(\d+)", timeout_s=10)
        assert match.group(1) == "4242"
        assert child.running
        # a line already printed is found again
        assert (await child.wait_for_line("starting", timeout_s=1)).group(0) == "starting"
    assert child.returncode == -signal.SIGTERM
    assert log.read_text().splitlines() == ["starting", "ready port=4242"]


async def test_an_exit_before_the_line_and_a_timeout_say_so_with_the_output() -> None:
    early = ChildProcess(_python("import sys; print('bad flag'); sys.exit(3)"), name="early")
    await early.start()
    with pytest.raises(ChildProcessError, match=r"early ended \(exit 3\)[\s\S]*bad flag"):
        await early.wait_for_line("ready", timeout_s=10)
    slow = ChildProcess(_python("import time; print('working'); time.sleep(60)"), name="slow")
    await slow.start()
    with pytest.raises(ChildProcessError, match=r"slow did not print 'ready' within 0.3 s[\s\S]*working"):
        await slow.wait_for_line("ready", timeout_s=0.3)
    await slow.stop()


async def test_a_child_that_ignores_sigterm_is_killed_and_stderr_can_be_the_captured_stream() -> None:
    stubborn = ChildProcess(
        _python("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('out'); print('on stderr', file=sys.stderr); time.sleep(60)"),
        stderr="capture",
    )
    await stubborn.start()
    await stubborn.wait_for_line("on stderr", timeout_s=10)
    assert list(stubborn.lines) == ["on stderr"]  # stdout discarded
    assert await stubborn.stop(timeout_s=0.3) == -signal.SIGKILL
