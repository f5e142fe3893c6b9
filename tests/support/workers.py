"""Real ``kinbox worker`` processes for the fault suite, their delivery logs, and the drain.

Workers are subprocesses running :mod:`tests.support.effect_app` against the
real broker and the real database, with the short timings of
:mod:`tests.support.launch`; what they received is read back from the
delivery logs the app writes. :mod:`tests.support.records` produces and reads
records, :mod:`tests.support.invariants` checks the outcome.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.launch import FAST_KAFKA, FAST_TIMINGS, ROOT, timing_env, worker_argv
from tests.support.records import Produced, committed
from tests.support.waiting import wait_for

APP = "tests.support.effect_app:app"

FAST_ENV = timing_env({**FAST_TIMINGS, "shutdown_timeout": 20})
"""The workers' ``KINBOX_*`` timings: a killed member leaves the group in seconds, not 45."""


# -- worker processes --


@dataclass
class Worker:
    """A running ``kinbox worker`` subprocess and its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    def log(self) -> str:
        """Everything the worker wrote to stderr/stdout so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, indented, for assertion messages."""
        tail = self.log().splitlines()[-lines:]
        return f"--- {self.name} (pid {self.pid}) log tail ---\n" + "\n".join(
            "    " + line for line in tail
        )

    def dump_stacks(self, settle: float = 1.0) -> None:
        """Have a live worker write every thread's Python stack into its log (``SIGUSR1``).

        For a wait that failed: the log then says where the member is stuck,
        a blocked C call (librdkafka, psycopg) included. The handler is
        :mod:`tests.support.effect_app`'s, the app of every worker this
        factory starts. ``settle``: seconds given to the dump to reach the file.
        """
        if self.proc.poll() is None:
            self.signal(signal.SIGUSR1)
            time.sleep(settle)

    def stuck_report(self, lines: int = 80) -> str:
        """The log tail after :meth:`dump_stacks`, and where the whole log is kept."""
        self.dump_stacks()
        return f"{self.log_tail(lines)}\n    (whole log: {self.log_path})"

    def wait_log(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """Wait until the log matches ``pattern`` (a regex); fail if the worker exits first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.log())
            if found:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited ({self.proc.returncode}) before logging {pattern!r}\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: no {pattern!r} in {timeout}s\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def wait_assigned(self, timeout: float = 60.0) -> None:
        """Wait until the group gave this worker at least one partition."""
        self.wait_log(r"assigned \[\(", timeout)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the worker (ignored if it already exited)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the worker to exit; return its status (negative: killed by that signal)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout}s\n{self.log_tail()}"
            ) from None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (a clean shutdown); SIGKILL if it hangs, and fail then."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} ignored SIGTERM for {timeout}s\n{self.log_tail()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL and reap (cleanup path)."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


HANDLERS: dict[str, dict[str, object]] = {h: {"handler": h} for h in ("sync", "async")}
"""Scenario cases that run one story over the sync handler and over its async twin."""


@dataclass
class WorkerFactory:
    """Starts workers for one scenario run; every worker it started is killed at the end."""

    bootstrap: str
    database_url: str
    group: str
    schema: str
    topic: str
    log_dir: Path
    started: list[Worker] = field(default_factory=list)
    handler: str = "sync"
    """``sync`` or ``async``: which handler of the app every worker runs (``FAULT_HANDLER``)."""
    concurrency: int = 0
    """Keys every worker's handler applies at once, in key order; 0: partition order
    (``FAULT_KEY_CONCURRENCY``)."""
    app: str = APP
    """The ``module:attribute`` of the app the workers run."""

    def start(
        self,
        name: str,
        *,
        failpoints: str = "",
        env: Mapping[str, str] | None = None,
        database_url: str | None = None,
        bootstrap: str | None = None,
        batch_max_messages: int = 50,
        args: Sequence[str] = (),
        kafka: Mapping[str, str | None] | None = None,
    ) -> Worker:
        """Start ``kinbox worker <app>`` (:attr:`app`) with this run's settings.

        Args:
            args: more ``kinbox worker`` options (``--missing-id fail``...).
            kafka: ``-X`` properties over :data:`FAST_KAFKA`; ``None`` drops one
                (KIP-848 refuses the classic protocol's heartbeat setting).
        """
        full_env = {
            **os.environ,
            **FAST_ENV,
            "KINBOX_FAILPOINTS": failpoints,
            # The app module reads these at import (the flags below say the same).
            "KINBOX_SCHEMA": self.schema,
            "KINBOX_GROUP_ID": self.group,
            "FAULT_TOPIC": self.topic,
            "FAULT_LOG_DIR": str(self.log_dir),
            "FAULT_HANDLER": self.handler,
            "FAULT_KEY_CONCURRENCY": str(self.concurrency),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        options = [
            "--bootstrap-servers", bootstrap or self.bootstrap,
            "--database-url", database_url or self.database_url,
            "--group-id", self.group,
            "--schema", self.schema,
            "--batch-max-messages", str(batch_max_messages),
            *args,
        ]  # fmt: skip
        argv = worker_argv(self.app, options, {**FAST_KAFKA, **(kafka or {})})
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        worker = Worker(name, proc, log_path)
        self.started.append(worker)
        return worker

    def kill_all(self) -> None:
        """SIGKILL whatever is still running (the test's cleanup)."""
        for worker in self.started:
            worker.kill()


# -- delivery log (written by effect_app in each worker) --


@dataclass
class Deliveries:
    """What the workers' delivery logs say, summed over every worker process."""

    records: Counter[tuple[int, int]] = field(default_factory=Counter)
    """(partition, offset) -> times handed to kinbox's batch processor."""
    handler_calls: int = 0
    applied: int = 0
    duplicates: int = 0
    attempts: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    """(partition, offset) -> the ``attempt`` of each handler call on that record, in call order."""
    holds: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    """Event id -> ``(begin|end, monotonic time)`` of the handler's held calls."""

    @property
    def total(self) -> int:
        """Records delivered, redeliveries included."""
        return sum(self.records.values())

    @property
    def redelivered(self) -> dict[tuple[int, int], int]:
        """Records delivered more than once."""
        return {k: v for k, v in self.records.items() if v > 1}


def read_deliveries(log_dir: Path) -> Deliveries:
    """Sum every ``deliveries-*.log`` in ``log_dir``."""
    out = Deliveries()
    for path in sorted(log_dir.glob("deliveries-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "d" and len(parts) >= 3:
                out.records[(int(parts[1]), int(parts[2]))] += 1
            elif parts[0] == "h":
                out.handler_calls += 1
                if len(parts) == 5:
                    where = (int(parts[1]), int(parts[2]))
                    out.attempts.setdefault(where, []).append(int(parts[4]))
            elif parts[0] == "w" and len(parts) == 6:
                out.holds.setdefault(parts[3], []).append((parts[4], float(parts[5])))
            elif parts[0] == "r" and len(parts) == 3:
                out.applied += int(parts[1])
                out.duplicates += int(parts[2])
    return out


def drain(
    factory: WorkerFactory,
    produced: Produced,
    *,
    timeout: float = 90.0,
    name: str = "drain",
    args: Sequence[str] = (),
    kafka: Mapping[str, str | None] | None = None,
) -> Worker:
    """Run a clean worker until the group's committed offsets reach the end, then stop it.

    Fails (with the worker's log) if the offsets do not get there: a stuck
    partition is a finding, not something to wait out.
    """
    worker = factory.start(name, args=args, kafka=kafka)
    # Joined first: with the offsets already at the end, a SIGTERM during
    # start-up would otherwise hit the process before its handlers exist.
    worker.wait_assigned(timeout)
    ends = produced.end_offsets()

    def caught_up() -> bool:
        if worker.proc.poll() is not None:
            raise AssertionError(f"{name} exited ({worker.proc.returncode})\n{worker.log_tail()}")
        got = committed(factory.bootstrap, factory.group, produced.topic, produced.partitions)
        return all(got.get(p, 0) >= end for p, end in ends.items())

    try:
        wait_for(caught_up, timeout, f"committed offsets to reach {ends}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.stuck_report()}") from None
    status = worker.stop()
    assert status == 0, f"{name} exited {status} on SIGTERM\n{worker.log_tail()}"
    return worker


@contextlib.contextmanager
def workers(
    bootstrap: str, database_url: str, group: str, schema: str, topic: str, log_dir: Path
) -> Iterator[WorkerFactory]:
    """A :class:`WorkerFactory` whose workers are all SIGKILLed when the block ends."""
    log_dir.mkdir(parents=True, exist_ok=True)
    factory = WorkerFactory(bootstrap, database_url, group, schema, topic, log_dir)
    try:
        yield factory
    finally:
        factory.kill_all()
