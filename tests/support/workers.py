"""Real ``kinbox worker`` processes, a producer, and the invariant checker of the fault suite.

Everything here talks to the real broker and the real database: workers are
subprocesses running :mod:`tests.support.effect_app`, offsets are read back
from the broker with ``Consumer.committed``, effects are counted in the
database. Nothing is faked, so the numbers the scoreboard prints are measured.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from psycopg import sql

from kinbox.inbox_schema import INBOX
from kinbox.store import apply_migrations

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.support.effect_app:app"
Conn = psycopg.Connection[tuple[Any, ...]]

# Short timeouts so a killed member leaves the group in seconds, not 45.
FAST_KAFKA = {
    "heartbeat.interval.ms": "500",
    "topic.metadata.refresh.interval.ms": "2000",
    "reconnect.backoff.max.ms": "1000",
}
FAST_ENV = {
    "KINBOX_SESSION_TIMEOUT": "6",
    "KINBOX_MAX_POLL_INTERVAL": "30",
    "KINBOX_RETRY_INITIAL": "0.1",
    "KINBOX_RETRY_MAX": "1",
    "KINBOX_SHUTDOWN_TIMEOUT": "20",
}


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.1 s; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


# -- database --


def prepare_schema(database_url: str, schema: str, table: str = "effects") -> None:
    """Migrate the inbox into ``schema`` and create the effect table (no unique key on ids)."""
    apply_migrations(database_url, schema, [INBOX])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.{} (seq bigserial PRIMARY KEY, event_id text,"
                ' topic text, partition int, "offset" bigint, pid int)'
            ).format(sql.Identifier(schema), sql.Identifier(table))
        )


def effect_counts(database_url: str, schema: str, table: str = "effects") -> Counter[str]:
    """How many effect rows each event id has."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT event_id, count(*) FROM {}.{} GROUP BY event_id").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
        ).fetchall()
    return Counter({r[0]: int(r[1]) for r in rows})


def processed(database_url: str, schema: str, group: str) -> dict[str, str]:
    """``processed_events`` of ``group``: event id -> status."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT event_id, status FROM {}.processed_events WHERE consumer = %s").format(
                sql.Identifier(schema)
            ),
            (group,),
        ).fetchall()
    return {r[0]: r[1] for r in rows}


# -- Kafka --


@dataclass(frozen=True)
class Produced:
    """What the producer wrote, from its delivery reports."""

    topic: str
    partitions: int
    records: dict[tuple[int, int], str]
    """(partition, offset) -> event id."""

    @property
    def ids(self) -> set[str]:
        """Distinct event ids (duplicates share one)."""
        return set(self.records.values())

    def end_offsets(self) -> dict[int, int]:
        """Next offset after the last record, per partition written to."""
        ends: dict[int, int] = {}
        for partition, offset in self.records:
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        return ends


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: int,
    *,
    prefix: str,
    duplicates: int = 0,
    rng: random.Random | None = None,
) -> Produced:
    """Write ``count`` events ``<prefix>-<n>`` round-robin over ``partitions``.

    ``duplicates`` extra records repeat random earlier ids (the same ``event-id``
    header at a later offset, possibly on another partition): the inbox must
    suppress them.
    """
    rng = rng or random.Random(0)
    plan = [(f"{prefix}-{n}", n % partitions) for n in range(count)]
    for _ in range(duplicates):
        event_id, _partition = plan[rng.randrange(count)]
        plan.insert(rng.randrange(len(plan) + 1), (event_id, rng.randrange(partitions)))
    records: dict[tuple[int, int], str] = {}
    errors: list[str] = []

    def delivered(event_id: str, err: Any, msg: Any) -> None:
        # The id comes from the closure: a delivery report's headers are not
        # reliably readable from inside the callback.
        if err is not None:
            errors.append(str(err))
            return
        records[(msg.partition(), msg.offset())] = event_id

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for event_id, partition in plan:
        producer.produce(
            topic,
            value=b'{"n": 1}',
            partition=partition,
            headers=[("event-id", event_id.encode())],
            on_delivery=functools.partial(delivered, event_id),
        )
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0 and not errors, f"produce failed: {left} undelivered, errors {errors[:3]}"
    return Produced(topic, partitions, records)


def _retrying(action: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Run ``action`` until it stops raising a retriable Kafka error (coordinator loading...)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = err is not None and (err.retriable() or "coordinator" in err.str().lower())
            if not retriable or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {exc}") from exc
            time.sleep(0.5)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Committed offsets of ``group`` read back from the broker (absent ones left out)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        parts = _retrying(
            lambda: consumer.committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout=10
            ),
            f"reading committed offsets of {group!r}",
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in parts if tp.offset >= 0}


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

    def start(
        self,
        name: str,
        *,
        failpoints: str = "",
        env: Mapping[str, str] | None = None,
        database_url: str | None = None,
        bootstrap: str | None = None,
        batch_max_messages: int = 50,
    ) -> Worker:
        """Start ``kinbox worker tests.support.effect_app:app`` with this run's settings."""
        full_env = {
            **os.environ,
            **FAST_ENV,
            "KINBOX_FAILPOINTS": failpoints,
            # The app module reads these at import (the flags below say the same).
            "KINBOX_SCHEMA": self.schema,
            "KINBOX_GROUP_ID": self.group,
            "FAULT_TOPIC": self.topic,
            "FAULT_LOG_DIR": str(self.log_dir),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        argv = [
            sys.executable, "-m", "kinbox.cli", "worker", APP,
            "--bootstrap-servers", bootstrap or self.bootstrap,
            "--database-url", database_url or self.database_url,
            "--group-id", self.group,
            "--schema", self.schema,
            "--batch-max-messages", str(batch_max_messages),
        ]  # fmt: skip
        for key, value in FAST_KAFKA.items():
            argv += ["-X", f"{key}={value}"]
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
            elif parts[0] == "r" and len(parts) == 3:
                out.applied += int(parts[1])
                out.duplicates += int(parts[2])
    return out


# -- invariants --


def offsets_behind_database(
    database_url: str, schema: str, bootstrap: str, group: str, produced: Produced
) -> list[str]:
    """Invariant 2, sampled once: records below a committed offset whose id is not in the DB.

    Offsets are read *before* the database: both only grow, so anything the
    database lacks at the later read it also lacked when the offset was seen.
    """
    offsets = committed(bootstrap, group, produced.topic, produced.partitions)
    done = processed(database_url, schema, group)
    return [
        f"partition {p} committed at {offsets[p]} but event {eid!r} at offset {o} is not in "
        f"processed_events"
        for (p, o), eid in sorted(produced.records.items())
        if o < offsets.get(p, 0) and eid not in done
    ]


class OffsetSampler:
    """Checks invariant 2 in a background thread every ``interval`` s while faults happen.

    Read errors while a service is down are expected and skipped; a violation
    is kept and reported by :meth:`violations`.
    """

    def __init__(
        self, database_url: str, schema: str, bootstrap: str, group: str, produced: Produced,
        interval: float = 0.5,
    ) -> None:  # fmt: skip
        self._args = (database_url, schema, bootstrap, group, produced)
        self._interval = interval
        self._stop = threading.Event()
        self._found: list[str] = []
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="offset-sampler", daemon=True)

    def _sample(self) -> None:
        try:
            found = offsets_behind_database(*self._args)
        except (AssertionError, psycopg.Error, KafkaException):
            return  # a service is down right now: that is the fault, not a finding
        self.samples += 1
        self._found.extend(found)

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> OffsetSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._sample()  # one more after the fault: short faults end before the first tick

    def violations(self) -> list[str]:
        """Invariant-2 violations seen while sampling."""
        return list(self._found)


def drain(
    factory: WorkerFactory, produced: Produced, *, timeout: float = 90.0, name: str = "drain"
) -> Worker:
    """Run a clean worker until the group's committed offsets reach the end, then stop it.

    Fails (with the worker's log) if the offsets do not get there: a stuck
    partition is a finding, not something to wait out.
    """
    worker = factory.start(name)
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
        raise AssertionError(f"{exc}\n{worker.log_tail()}") from None
    status = worker.stop()
    assert status == 0, f"{name} exited {status} on SIGTERM\n{worker.log_tail()}"
    return worker


@dataclass(frozen=True)
class Outcome:
    """The measured result of one scenario run (a scoreboard row's numbers)."""

    produced: int
    events: int
    deliveries: int
    applied_once: int
    duplicates_suppressed: int
    dead_lettered: int
    lost: list[str]
    applied_twice: dict[str, int]
    offsets: dict[int, int]


def check_invariants(
    factory: WorkerFactory, produced: Produced, *, table: str = "effects"
) -> Outcome:
    """After a final drain: exactly-once effects, nothing lost, offsets at the end and covered.

    Returns the measured :class:`Outcome`; the caller asserts on it (so the
    scoreboard row is recorded even when the run fails).
    """
    effects = effect_counts(factory.database_url, factory.schema, table)
    status = processed(factory.database_url, factory.schema, factory.group)
    offsets = committed(factory.bootstrap, factory.group, produced.topic, produced.partitions)
    deliveries = read_deliveries(factory.log_dir)
    ids = produced.ids
    dead = {i for i, s in status.items() if s == "dead_lettered"}
    lost = sorted(i for i in ids if effects.get(i, 0) == 0 and i not in dead)
    twice = {i: n for i, n in effects.items() if n > 1}
    return Outcome(
        produced=len(produced.records),
        events=len(ids),
        deliveries=deliveries.total,
        applied_once=sum(1 for i in ids if effects.get(i, 0) == 1),
        duplicates_suppressed=deliveries.duplicates,
        dead_lettered=len(dead),
        lost=lost,
        applied_twice=twice,
        offsets=offsets,
    )


def assert_invariants(
    outcome: Outcome, produced: Produced, factory: WorkerFactory, sampler_violations: list[str]
) -> None:
    """Fail with specifics if any invariant of DESIGN.md (1, 2) does not hold."""
    problems = []
    if outcome.lost:
        problems.append(f"{len(outcome.lost)} events lost (no effect row): {outcome.lost[:10]}")
    if outcome.applied_twice:
        sample = dict(list(outcome.applied_twice.items())[:10])
        problems.append(f"{len(outcome.applied_twice)} events applied more than once: {sample}")
    status = processed(factory.database_url, factory.schema, factory.group)
    missing = sorted(produced.ids - set(status))
    if missing:
        problems.append(f"{len(missing)} events missing from processed_events: {missing[:10]}")
    ends = produced.end_offsets()
    if any(outcome.offsets.get(p, 0) != end for p, end in ends.items()):
        problems.append(f"committed offsets {outcome.offsets} != end offsets {ends}")
    behind = offsets_behind_database(
        factory.database_url, factory.schema, factory.bootstrap, factory.group, produced
    )
    problems += behind[:10] + sampler_violations[:10]
    if problems:
        logs = "\n".join(w.log_tail(25) for w in factory.started)
        raise AssertionError("invariants violated:\n  " + "\n  ".join(problems) + "\n" + logs)


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
