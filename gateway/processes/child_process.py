"""Child processes, started and stopped one way everywhere (Envoy, the simulator, redis-server,
picker workers; the tests and benchmarks use the same class).

A child runs in its own session (a Ctrl-C in the terminal reaches kvgate only, which stops its
children in order) and does not outlive kvgate: on Linux it is started through util-linux's
``setpriv --pdeathsig TERM``, which asks the kernel to send it SIGTERM when its parent dies and
then execs the real command (same pid); elsewhere, or without ``setpriv``, the command runs
unchanged. Its output (stdout, with stderr merged unless told otherwise) is read line by line into
a bounded tail, optionally copied to a log file or echoed; :meth:`ChildProcess.wait_for_line`
waits for a line that says it is ready. :meth:`ChildProcess.stop` sends SIGTERM, then SIGKILL after
a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Literal, Self

Stderr = Literal["merge", "capture", "inherit", "discard"]
"""``merge``: into the captured stdout; ``capture``: stderr is the captured stream and stdout is
discarded (Envoy logs to stderr); ``inherit``: this process's stderr; ``discard``: dropped."""


def dies_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so the process gets SIGTERM when this process dies (best effort, Linux)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "TERM", "--", *argv]


class ChildProcessError(RuntimeError):
    """The child exited, or did not print what was waited for in time; carries its output's tail."""


class ChildProcess:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        stderr: Stderr = "merge",
        env: Mapping[str, str] | None = None,
        keep_lines: int = 500,
        log_path: Path | None = None,
        echo: IO[str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.name = name or Path(self.argv[0]).name
        self._stderr = stderr
        self._env = dict(env) if env is not None else None
        self.lines: deque[str] = deque(maxlen=keep_lines)
        """The last lines of output, oldest first."""
        self._log_path = log_path
        self.echo = echo
        """Where each line is copied as it comes (settable while running)."""
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._count = 0
        self._eof = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def tail(self, count: int = 30) -> str:
        return "\n".join(list(self.lines)[-count:])

    async def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        stdout = devnull if self._stderr == "capture" else pipe
        stderr = {"merge": asyncio.subprocess.STDOUT, "capture": pipe, "inherit": None, "discard": devnull}
        self.lines.clear()
        self._count, self._eof = 0, False
        self._process = await asyncio.create_subprocess_exec(
            *dies_with_parent(self.argv), stdin=devnull, stdout=stdout, stderr=stderr[self._stderr],
            start_new_session=True, env=self._env,
        )
        stream = self._process.stderr if self._stderr == "capture" else self._process.stdout
        assert stream is not None
        self._reader = asyncio.create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        log = self._log_path.open("a", encoding="utf-8") if self._log_path is not None else None
        try:
            async for raw in stream:
                line = raw.decode(errors="replace").rstrip("\r\n")
                self.lines.append(line)
                if log is not None:
                    log.write(line + "\n")
                    log.flush()
                if self.echo is not None:
                    self.echo.write(line + "\n")
                    self.echo.flush()
                async with self._changed:
                    self._count += 1
                    self._changed.notify_all()
        finally:
            if log is not None:
                log.close()
            async with self._changed:
                self._eof = True
                self._changed.notify_all()

    async def wait_for_line(self, pattern: str | re.Pattern[str], timeout_s: float = 30.0) -> re.Match[str]:
        """The first line (kept, or still to come) that ``pattern`` matches from its start; raises
        :class:`ChildProcessError` when the output ends first or after ``timeout_s``."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern

        async def found() -> re.Match[str]:
            checked = 0
            async with self._changed:
                while True:
                    new = list(self.lines)[-(self._count - checked):] if self._count > checked else []
                    for line in new:
                        match = regex.match(line)
                        if match is not None:
                            return match
                    checked = self._count
                    if self._eof:
                        raise ChildProcessError(
                            f"{self.name} ended (exit {await self._exit_code()}) before printing "
                            f"{regex.pattern!r}:\n{self.tail()}"
                        )
                    await self._changed.wait()

        try:
            return await asyncio.wait_for(found(), timeout_s)
        except TimeoutError as exc:
            raise ChildProcessError(
                f"{self.name} did not print {regex.pattern!r} within {timeout_s:g} s:\n{self.tail()}"
            ) from exc

    async def _exit_code(self) -> int | None:
        if self._process is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._process.wait()), 1.0)
        return self._process.returncode

    async def wait(self) -> int:
        """Until the child exits; its exit status."""
        assert self._process is not None, f"{self.name} was never started"
        return await self._process.wait()

    def send_signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self._process is not None
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(sig)

    async def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit status (None if never started)."""
        process = self._process
        if process is None:
            return None
        if process.returncode is None:
            self.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        await self._finish_reading()
        return process.returncode

    async def kill(self) -> None:
        """SIGKILL now (a crash, as tests simulate one)."""
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        await self._finish_reading()

    async def _finish_reading(self) -> None:
        reader, self._reader = self._reader, None
        if reader is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(reader), 1.0)
        except (TimeoutError, asyncio.CancelledError):
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
