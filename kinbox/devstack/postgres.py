"""A private PostgreSQL cluster on a free loopback port.

The server binaries come from the distribution's package (Debian keeps them in
``/usr/lib/postgresql/<version>/bin``, off PATH). The cluster lives in a
temporary directory; as root everything runs as the ``postgres`` account,
because the server refuses to run as root.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import psycopg

from kinbox.core.errors import ServiceError
from kinbox.devstack.process import LocalService, ServiceProcess, free_port, port_open

DATABASE = "kinbox"


def find_bindir() -> Path:
    """Locate the PostgreSQL server binaries, newest version first.

    ``KINBOX_PG_BINDIR`` wins; then Debian's versioned directories; then PATH.
    """
    explicit = os.environ.get("KINBOX_PG_BINDIR")
    candidates = [Path(explicit)] if explicit else []
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += versions
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "postgres").exists():
            return directory
    raise ServiceError(
        "PostgreSQL server binaries not found (looked for initdb in /usr/lib/postgresql/*/bin "
        "and on PATH): install the postgresql-15 package, or set KINBOX_PG_BINDIR, or point "
        "KINBOX_TEST_DATABASE_URL at an existing server"
    )


class PostgresServer(LocalService):
    """A throwaway PostgreSQL server: ``start()``, ``restart()``, ``stop()``.

    Args:
        fsync: keep durable commits (benchmarks); tests turn it off for speed.
        settings: extra ``-c name=value`` server settings.
    """

    def __init__(self, *, fsync: bool = False, settings: dict[str, str] | None = None) -> None:
        self.bindir = find_bindir()
        self.port = free_port()
        self.fsync = fsync
        self.settings = settings or {}
        super().__init__("kinbox-pg-")
        self.datadir = self._base / "data"
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user:
            try:
                account = pwd.getpwnam(self._user)
            except KeyError as exc:
                raise ServiceError(
                    "running as root needs a 'postgres' user to run the server"
                ) from exc
            os.chown(self._base, account.pw_uid, account.pw_gid)

    @property
    def version(self) -> str:
        """The server's version string, e.g. ``15.18``."""
        out = subprocess.run(
            [str(self.bindir / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout
        found = re.search(r"\(PostgreSQL\) (\S+)", out)
        return found.group(1) if found else out.strip()

    @property
    def url(self) -> str:
        """Connection URL of the test database on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run_as_owner(self, argv: Sequence[str]) -> None:
        command = ["runuser", "-u", self._user, "--", *argv] if self._user else list(argv)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ServiceError(
                f"{argv[0]} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )

    def start(self, timeout: float = 60.0) -> PostgresServer:
        """Create the cluster if needed, start the server, create the database; wait until ready."""
        if not (self.datadir / "PG_VERSION").exists():
            self._run_as_owner(
                [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                 "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"]
            )  # fmt: skip
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self._base),
            # fsync off only skips flushing the kernel's page cache: a killed
            # server (the faults the tests inject) still loses nothing, an OS
            # crash could. synchronous_commit stays on whatever fsync says:
            # without it an immediate restart loses acknowledged commits, and
            # the crash tests would see the database forget what it confirmed.
            "fsync": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            "max_connections": "200",
            "wal_level": "logical",  # so a Debezium connector can read it
            "shared_buffers": "256MB",
            "log_min_messages": "warning",
            **self.settings,
        }
        argv = [str(self.bindir / "postgres"), "-D", str(self.datadir)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        # SIGQUIT on parent death: the postmaster's immediate shutdown, which
        # also takes its backends down.
        self._process = ServiceProcess(
            "postgres", argv, log_path=self._base / "postgres.log", user=self._user,
            death_signal=signal.SIGQUIT, cwd=self._base,
        )  # fmt: skip
        self._process.wait_until(self._accepts, timeout=timeout, what="accepting connections")
        self._create_database()
        return self

    def _accepts(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            with psycopg.connect(self.admin_url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    @property
    def admin_url(self) -> str:
        """URL of the maintenance database ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _create_database(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if not found:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')  # constant name, not input

    def restart(self, *, immediate: bool = True, timeout: float = 60.0) -> None:
        """Stop and start the server on the same port, like ``pg_ctl restart -m immediate``.

        Immediate mode (SIGQUIT) aborts every session without a checkpoint: the
        next start runs crash recovery, as after a power cut.
        """
        self.stop(signal.SIGQUIT if immediate else signal.SIGINT)
        self.start(timeout=timeout)

    def stop(self, signum: int = signal.SIGINT) -> None:
        """Stop the server (SIGINT: PostgreSQL's fast shutdown) and wait for it."""
        if self._process is not None:
            self._process.stop(signum, timeout=30)
