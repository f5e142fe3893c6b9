"""Contender processes: start with a spec, read their peak RSS, stop, kill.

Each child gets the parent-death signal (Linux), so a benchmark that is
itself killed leaves no consumer behind; its log goes to a file whose tail
is quoted when it fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kinbox.bench.spec import ChildSpec
from kinbox.core.errors import KinboxError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """One running process of the benchmark (a contender's consumer, or the relay)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        base: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``argv``; its environment is ``base`` (default: this one's) plus ``env``."""
        self.name = name
        self.log_path = log_path
        self.started = time.time()
        """When it was started, seconds since the epoch."""
        inherited = os.environ if base is None else base
        with log_path.open("ab") as log:
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**inherited, "PYTHONUNBUFFERED": "1", **(env or {})},
                preexec_fn=_die_with_parent,
            )
        self.peak_rss = 0
        """Highest resident set size seen, bytes (``VmHWM``; 0 where /proc is missing)."""

    @property
    def pid(self) -> int:
        """The process id."""
        return self._popen.pid

    def alive(self) -> bool:
        """Whether the process has not exited."""
        return self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once exited (negative: killed by that signal)."""
        return self._popen.poll()

    def sample_rss(self) -> int:
        """Read the process's peak RSS so far; keep the highest seen (also after a kill)."""
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss = max(self.peak_rss, int(line.split()[1]) * 1024)
        return self.peak_rss

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for a clean exit; SIGKILL after ``timeout``. Returns the status."""
        self.sample_rss()
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise KinboxError(
                f"{self.name} ignored SIGTERM for {timeout:.0f}s\n{self.log_tail()}"
            ) from None

    def terminate(self) -> None:
        """SIGTERM without waiting (a member leaving the group while others work)."""
        self.sample_rss()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL and reap (cleanup path)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(10)

    def wait_exit(self, timeout: float, on_wait: Callable[[], None] = lambda: None) -> int | None:
        """Wait up to ``timeout`` seconds for the process to exit by itself.

        ``on_wait`` is called between looks (it may raise to stop waiting).
        """
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            self.sample_rss()
            on_wait()
            time.sleep(0.02)
        return self.returncode

    def log_tail(self, lines: int = 30) -> str:
        """The log's last lines, indented, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"(no log at {self.log_path})"
        return f"--- {self.name} (pid {self.pid}) log tail ---\n" + "\n".join(
            "    " + line for line in text
        )


def start_contender(
    spec: ChildSpec,
    name: str,
    log_dir: Path,
    failpoints: str = "",
    env: Mapping[str, str] | None = None,
) -> Child:
    """Start ``python -m kinbox.bench.child`` for ``spec``.

    Args:
        spec: the contender's orders.
        name: the process's name in logs (and its log file's).
        log_dir: where the log file goes.
        failpoints: ``KINBOX_FAILPOINTS`` for the child (every contender honours
            ``after_db_commit=kill@N``: see :mod:`kinbox.core.failpoints`).
        env: more environment.
    """
    env = {**(env or {}), ChildSpec.ENV: spec.to_json(), "KINBOX_FAILPOINTS": failpoints}
    argv = [sys.executable, "-m", "kinbox.bench.child"]
    return Child(name, argv, log_dir / f"{name}.log", env)
