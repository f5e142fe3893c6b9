"""The soak's churn: members started, SIGTERMed, SIGKILLed and SIGSTOPped at seeded moments.

:class:`Churn` keeps between one and ``max_members`` real ``kinbox worker``
processes in the group and, each time :meth:`Churn.act` is called (every few
seconds), does one seeded thing to it: start a member, SIGTERM one (it must
finish its batches and exit 0 within :data:`TERM_GRACE`), SIGKILL one (frozen
ones too), SIGSTOP one for a moment or past the group's session timeout (it
is expelled, and comes back as a zombie when SIGCONT thaws it), or SIGKILL
the producer and start it again. :meth:`Churn.tick` thaws members when due
and reaps the ones that ended: an exit nobody asked for, a SIGTERM answered
with another status or not at all, are *findings*, kept with the member's
log tail. Every action is printed and written to ``churn.log`` with its time
since the start, so a failing round can be read against the workers' logs.

Each member logs to ``<name>.log`` in the round's log directory; once it has
ended, a log over :data:`TRIM_BYTES` is cut to its head and tail (a running
one's over :data:`LIVE_TRIM_BYTES`), so that a soak of hours keeps its logs on
disk at a bounded size. The seed fixes the sequence of choices; whom each
one hits depends on who is running at that moment.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.soak_producer import ProducerProcess
from tests.support.workers import Worker, WorkerFactory

TERM_GRACE = 60.0
"""Seconds a SIGTERMed member has to exit: its shutdown timeout (20 s) plus a batch
waiting for a frozen member's open transaction."""
TRIM_BYTES = 2_000_000
LIVE_TRIM_BYTES = 20_000_000
"""A running member's log is cut too past this (lines it writes meanwhile may be lost)."""
HEAD_LINES, TAIL_LINES = 300, 3000
STARTED = "starting with Settings("
"""What ``kinbox worker`` logs once its SIGTERM handler is in place."""


@dataclass
class Member:
    """A member the churn started, and what became of it."""

    worker: Worker
    started: float
    termed: float | None = None
    """When it was sent SIGTERM."""
    killed: bool = False
    frozen_until: float | None = None
    ended: str = ""
    """How it ended, once reaped: ``SIGTERM -> 0``, ``SIGKILL``, ``exited 1 unprompted``..."""

    @property
    def name(self) -> str:
        """Its name (and log file's)."""
        return self.worker.name

    def alive(self) -> bool:
        """Whether its process still runs (frozen or not)."""
        return self.worker.proc.poll() is None

    def awake(self) -> bool:
        """Alive, not frozen, not on its way out."""
        return self.alive() and self.frozen_until is None and self.termed is None


@dataclass
class Churn:
    """The members of one soak round and the seeded things done to them.

    Args:
        factory: starts the members (the soak's app, this round's group).
        rng: the round's random choices.
        kafka: ``-X`` properties of every member (the assignment protocol).
        env: the members' environment (the app's settings).
        session_timeout: the group's, in seconds: a long freeze outlasts it.
        producer: the round's producer, killed and restarted now and then.
        log_dir: where ``churn.log`` goes.
    """

    factory: WorkerFactory
    rng: random.Random
    kafka: Mapping[str, str | None]
    env: Mapping[str, str]
    session_timeout: float
    producer: ProducerProcess
    log_dir: Path
    max_members: int = 4
    members: list[Member] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    actions: int = 0
    began: float = field(default_factory=time.monotonic)
    _trimmed: float = field(default_factory=time.monotonic)

    def alive(self) -> list[Member]:
        """Members whose process runs."""
        return [m for m in self.members if m.alive()]

    def awake(self) -> list[Member]:
        """Members running, not frozen and not stopping."""
        return [m for m in self.members if m.awake()]

    def join(self) -> None:
        """Start a member, with a seeded batch size."""
        name = f"m{len(self.members) + 1}"
        batch = self.rng.choice([5, 20, 50])
        worker = self.factory.start(name, batch_max_messages=batch, kafka=self.kafka,
                                    env=self.env)  # fmt: skip
        self.members.append(Member(worker, time.monotonic()))
        self.say(f"join {name} (pid {worker.pid}, batches of {batch})")

    def act(self) -> None:
        """Do one seeded thing to the group (or to the producer), then keep a member awake."""
        choices: list[tuple[Callable[[], None], float]] = []
        if len(self.alive()) < self.max_members:
            choices.append((self.join, 3))
        if len(self.awake()) >= 2:  # one stays awake
            choices += [(self._leave, 2), (self._kill, 2), (self._freeze, 2)]
        choices.append((self._restart_producer, 0.3))
        self.actions += 1
        self.rng.choices([c for c, _ in choices], [w for _, w in choices])[0]()
        self.keep_one()

    def keep_one(self) -> None:
        """Start a member if none is awake."""
        if not self.awake():
            self.join()

    def _leave(self) -> None:
        member = self.rng.choice(self.awake())
        member.termed = time.monotonic()
        member.worker.signal(signal.SIGTERM)
        self.say(f"SIGTERM {member.name}")

    def _kill(self) -> None:
        # Any running member: a frozen one dies with its transaction open.
        member = self.rng.choice([m for m in self.alive() if m.termed is None])
        member.killed = True
        member.worker.signal(signal.SIGKILL)
        self.say(f"SIGKILL {member.name}{' (frozen)' if member.frozen_until else ''}")

    def _freeze(self) -> None:
        member = self.rng.choice(self.awake())
        long = self.rng.random() < 0.4
        seconds = self.rng.uniform(0.5, 3)
        if long:
            seconds = self.session_timeout + self.rng.uniform(2, 5)
        member.worker.signal(signal.SIGSTOP)
        member.frozen_until = time.monotonic() + seconds
        past = " (past the session timeout)" if long else ""
        self.say(f"SIGSTOP {member.name} for {seconds:.1f}s{past}")

    def _restart_producer(self) -> None:
        self.producer.kill_and_restart()
        self.say(f"SIGKILL the producer, instance {self.producer.instances} started")

    def tick(self, *, thaw_all: bool = False) -> None:
        """Thaw the members due (all with ``thaw_all``), reap the ones that ended."""
        now = time.monotonic()
        for member in self.members:
            until = member.frozen_until
            if until is not None and (thaw_all or until <= now):
                member.frozen_until = None
                member.worker.signal(signal.SIGCONT)
                self.say(f"SIGCONT {member.name}")
            if not member.ended:
                self._reap(member, now)
        if now - self._trimmed > 60:
            self._trimmed = now
            for member in self.alive():
                _trim(member.worker.log_path, LIVE_TRIM_BYTES)

    def _reap(self, member: Member, now: float) -> None:
        status = member.worker.proc.poll()
        if status is None:
            if member.termed is not None and now - member.termed > TERM_GRACE:
                member.worker.dump_stacks()
                self.found(member, f"still running {TERM_GRACE:.0f}s after SIGTERM")
                member.worker.kill()
                member.ended = "hung after SIGTERM, SIGKILLed"
            return
        if member.killed:
            member.ended = "SIGKILL"
        elif member.termed is not None:
            member.ended = f"SIGTERM -> {status}"
            if status == -signal.SIGTERM and STARTED not in member.worker.log():
                # Python's default for SIGTERM: the worker had not started yet.
                member.ended += " (before the worker installed its handler)"
            elif status != 0:
                self.found(member, f"exited {status} after SIGTERM")
        else:
            member.ended = f"exited {status} unprompted"
            self.found(member, member.ended)
        _trim(member.worker.log_path)

    def found(self, member: Member, what: str) -> None:
        """Keep a finding about ``member``, with its log tail."""
        self.findings.append(f"{member.name} (pid {member.worker.pid}) {what}\n"
                             f"{member.worker.log_tail(30)}")  # fmt: skip
        self.say(f"FINDING: {member.name} {what}")

    def say(self, what: str) -> None:
        """Print and log one action with its time since the start."""
        line = f"+{time.monotonic() - self.began:7.1f}s {what}"
        print(f"[soak] {line}")
        with (self.log_dir / "churn.log").open("a") as out:
            out.write(line + "\n")

    def stop_all(self) -> None:
        """SIGTERM every member still running and reap them (each must exit 0)."""
        self.tick(thaw_all=True)
        for member in self.alive():
            if member.termed is None:
                member.termed = time.monotonic()
                member.worker.signal(signal.SIGTERM)
                self.say(f"SIGTERM {member.name} (the end)")
        deadline = time.monotonic() + TERM_GRACE + 5
        while self.alive() and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.1)
        self.tick()

    def start_drain(self) -> Worker:
        """Start the member that drains the group at the end (not churned)."""
        worker = self.factory.start("drain", kafka=self.kafka, env=self.env)
        self.say(f"drain started (pid {worker.pid})")
        return worker

    def summary(self) -> str:
        """One line per member: name, pid, how long it lived, how it ended."""
        return "\n".join(
            f"    {m.name} pid {m.worker.pid}: {m.ended or 'running'}, log {m.worker.log_path}"
            for m in self.members
        )


def _trim(path: Path, limit: int = TRIM_BYTES) -> None:
    """Cut a member's log over ``limit`` bytes to its head and tail."""
    if not path.exists() or path.stat().st_size <= limit:
        return
    lines = path.read_text(errors="replace").splitlines()
    cut = len(lines) - HEAD_LINES - TAIL_LINES
    if cut > 0:
        kept = [*lines[:HEAD_LINES], f"[soak: {cut} lines trimmed]", *lines[-TAIL_LINES:]]
        path.write_text("\n".join(kept) + "\n")
