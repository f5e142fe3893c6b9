"""A child service process that cannot outlive the process that started it.

Both local services (the Kafka JVM and the PostgreSQL postmaster) are started
as direct children with ``PR_SET_PDEATHSIG``: if the test run or ``kinbox dev``
dies for any reason, even SIGKILL, the kernel signals the service too, so no
broker or postgres is left behind. That is also why PostgreSQL is not started
with ``pg_ctl`` (which daemonises it away from us) and why the switch to the
``postgres`` user happens in the child itself rather than through ``runuser``:
changing credentials clears the parent-death signal, so it must be set after.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kinbox.core.errors import ServiceError
from kinbox.ops.lifeline import die_with_parent


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Tell whether something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _child_setup(user: str | None, death_signal: int) -> Callable[[], None]:
    account = pwd.getpwnam(user) if user else None

    def setup() -> None:
        # Own process group: a Ctrl-C aimed at the test run's group does not
        # hit the services directly; they are stopped in order by their owner.
        os.setpgid(0, 0)
        if account is not None:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
        # After the credential change, which would clear it.
        die_with_parent(death_signal)

    return setup


class ServiceProcess:
    """One running service: its pid, its log file, and how to stop it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        death_signal: int = signal.SIGKILL,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        log = log_path.open("ab")
        try:
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                preexec_fn=_child_setup(user, death_signal),
            )
        except OSError as exc:
            raise ServiceError(f"cannot start {name}: {argv[0]!r}: {exc}") from exc
        finally:
            log.close()

    @property
    def pid(self) -> int:
        """The service's process id."""
        return self._popen.pid

    def running(self) -> bool:
        """Tell whether the process has not exited yet."""
        return self._popen.poll() is None

    def wait_until(self, ready: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Poll ``ready`` until true; fail with the log's tail if the process dies or times out."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                raise ServiceError(
                    f"{self.name} exited with status {self._popen.returncode} before {what}\n"
                    f"{self.log_tail()}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"{self.name} did not get to {what} in {timeout:.0f}s\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the service (no-op once it has exited)."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Ask the service to stop with ``signum``; SIGKILL it after ``timeout`` seconds."""
        if not self.running():
            return
        self.send_signal(signal.SIGCONT)  # a paused service cannot act on SIGTERM
        self.send_signal(signum)
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the service and reap it."""
        self.send_signal(signal.SIGKILL)
        self._popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the service's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {self.log_path})"
        tail = "\n".join("    " + line for line in text[-lines:])
        return f"--- last lines of {self.log_path} ---\n{tail}"


class LocalService:
    """What the local services share: a private temp directory and one child process.

    Subclasses start ``self._process`` and say how to ``stop()``; ``close()``
    stops and removes the directory.
    """

    def __init__(self, prefix: str) -> None:
        self._base = Path(tempfile.mkdtemp(prefix=prefix))
        self._process: ServiceProcess | None = None

    @property
    def pid(self) -> int | None:
        """The service's pid while it runs."""
        return self._process.pid if self._process and self._process.running() else None

    def stop(self) -> None:
        """Stop the service gracefully (overridden with the service's own signal)."""
        if self._process is not None:
            self._process.stop()

    def close(self) -> None:
        """Stop the service and remove its files."""
        self.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._base)

    def log_tail(self) -> str:
        """The service log's last lines."""
        return self._process.log_tail() if self._process else ""
