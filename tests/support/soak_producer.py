"""The churn soak's producer: a process writing events without pause, logging what the broker took.

``python -m tests.support.soak_producer --bootstrap B --topics T1,T2,T3 --log PATH --seed S``
writes event ``n`` (id ``<prefix>-<n>``, n = 0, 1, ...) at ``--rate`` events a
second, in bursts, to one of the topics, keyed, on the partition of its key
(key ``k<i>`` on partition ``i % --partitions``), with a JSON payload saying
what the handler must do with it (:mod:`tests.support.soak_app`). Everything
about event ``n`` follows from the seed and ``n`` (:func:`plan`), so a round
replays. An idempotent producer keeps each partition in send order, retries
included. About one send in a hundred repeats a recent event (the same record
again, as a producer retry or an outbox relay does): the inbox must drop it.

The log (``O_APPEND``, one write per call, so it survives a SIGKILL) says::

    start <pid> <next n>            a producer instance begins
    a <first> <last>                it is about to send new events first..last
    m <n>                           the previous instance sent n and was killed before
                                    its delivery report: a *maybe*, sent again now
    r <n>                           it sends n again (a repeat, or the maybe above)
    k <n> <topic> <partition> <offset>   the broker acknowledged n (topic: its index)
    f <n> <error>                   delivery failed: n was not sent by this try
    end <unreported>                SIGTERM: flushed; how many sends had no report

So an id counts as *sent* only with a ``k`` line; a ``f`` one was not sent (by
that try); a ``maybe`` is resolved by the topic itself, which the checker
reads back (:mod:`tests.support.soak_check`). :class:`ProducerProcess`
starts, kills and restarts the process for the soak.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tests.support.launch import ROOT

KINDS = (
    ("ok", 0.835), ("slow", 0.07), ("flaky", 0.05), ("swallow-savepoint", 0.02),
    ("poison", 0.01), ("swallow", 0.015),
)  # fmt: skip
"""What handlers do with an event (:mod:`tests.support.soak_app`), and how often."""
DEAD = frozenset({"poison", "swallow"})
"""The kinds whose events must end dead-lettered; every other kind must be applied once."""
TOPIC_SHARES = (0.6, 0.2, 0.2)
"""Shares of the events per topic: per-event, batch, async (:mod:`tests.support.soak_app`)."""
BATCH = 1
"""The batch handler's topic (index)."""
BATCH_FLAKY = 0.2
"""The share of ``flaky`` picks kept on the batch topic: there one such event fails its
whole batch, once in each member that meets it."""
KEYS = 36
REPEAT = 0.01
"""Chance that a send repeats a recent event rather than sending a new one."""


@dataclass(frozen=True)
class Planned:
    """What event ``n`` is: where it goes and what its handler must do."""

    n: int
    topic: int
    """Index into the topics."""
    key: str
    partition: int
    payload: dict[str, Any]


def plan(seed: str, n: int, partitions: int) -> Planned:
    """Event ``n`` of the round seeded ``seed``: always the same."""
    rng = random.Random(f"{seed}:{n}")
    topic = rng.choices(range(len(TOPIC_SHARES)), TOPIC_SHARES)[0]
    index = rng.randrange(KEYS)
    kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
    if kind == "flaky" and topic == BATCH and rng.random() > BATCH_FLAKY:
        kind = "ok"
    payload: dict[str, Any] = {"n": n, "key": f"k{index}", "kind": kind}
    if kind == "slow":
        # Mostly a stretch of a batch; one in ten holds it past a rebalance.
        payload["sleep"] = round(rng.uniform(0.01, 0.2) if rng.random() < 0.9
                                 else rng.uniform(1, 4), 3)  # fmt: skip
    elif kind == "flaky":
        payload["fails"] = rng.choice([1, 1, 2])
    return Planned(n, topic, f"k{index}", index % partitions, payload)


class _Log:
    """The producer's log file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, lines: list[str]) -> None:
        if lines:
            os.write(self._fd, ("\n".join(lines) + "\n").encode())


@dataclass
class Resume:
    """Where a new instance picks up: the next new ``n`` and the last instance's maybes."""

    next_n: int = 0
    maybes: list[int] = field(default_factory=list)


def resume(path: Path) -> Resume:
    """Read an earlier instance's log: the next ``n``, and what it sent without a report."""
    found = Resume()
    if not path.exists():
        return found
    sent: set[int] = set()
    with path.open() as lines:
        for line in lines:
            word, _, rest = line.partition(" ")
            parts = rest.split()
            if word == "start":
                sent = set()
            elif word == "a" and len(parts) == 2:
                first, last = int(parts[0]), int(parts[1])
                sent.update(range(first, last + 1))
                found.next_n = max(found.next_n, last + 1)
            elif word in {"r", "m"} and parts:
                sent.add(int(parts[0]))
            elif word in {"k", "f"} and parts:
                sent.discard(int(parts[0]))
            elif word == "end":
                sent = set()
    found.maybes = sorted(sent)
    return found


def run(args: argparse.Namespace) -> int:
    """The producer's main loop, until SIGTERM."""
    topics = args.topics.split(",")
    log = _Log(Path(args.log))
    start = resume(Path(args.log))
    rng = random.Random(f"{args.seed}:producer:{os.getpid()}")
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "log_level": 3})  # fmt: skip
    reports: list[str] = []
    recent: deque[int] = deque(maxlen=1000)

    def delivered(n: int, err: Any, msg: Any) -> None:
        if err is not None:
            reports.append(f"f {n} {''.join(str(err).split())[:200]}")
        else:
            reports.append(f"k {n} {topics.index(msg.topic())} {msg.partition()} {msg.offset()}")
            recent.append(n)

    def send(n: int) -> None:
        event = plan(args.seed, n, args.partitions)
        producer.produce(
            topics[event.topic], value=json.dumps(event.payload).encode(),
            key=event.key.encode(), partition=event.partition,
            headers=[("event-id", f"{args.prefix}-{n}".encode())],
            on_delivery=functools.partial(delivered, n),
        )  # fmt: skip

    log.write([f"start {os.getpid()} {start.next_n}"])
    for n in start.maybes:
        log.write([f"m {n}"])
        send(n)
    n = start.next_n
    began, made = time.monotonic(), 0
    while not stopping:
        due = int((time.monotonic() - began) * args.rate) - made
        # Now and then a burst, so that batches are full when a member goes.
        count = max(0, due) + (rng.randrange(50, 300) if rng.random() < 0.002 else 0)
        if count:
            log.write([f"a {n} {n + count - 1}"])
            for _ in range(count):
                send(n)
                n += 1
            made += count
        if recent and rng.random() < REPEAT * max(1, count):
            again = rng.choice(recent)
            log.write([f"r {again}"])
            send(again)
        producer.poll(0.02)
        log.write(reports)
        reports.clear()
    left = producer.flush(60)
    log.write([*reports, f"end {left}"])
    return 0


@dataclass
class ProducerProcess:
    """The producer subprocess of one soak round: started, SIGKILLed and restarted at will."""

    bootstrap: str
    topics: list[str]
    partitions: int
    seed: str
    prefix: str
    log_path: Path
    rate: float
    proc: subprocess.Popen[bytes] | None = None
    instances: int = 0

    def start(self) -> None:
        """Start an instance (it resumes from the log: its maybes first)."""
        argv = [
            sys.executable, "-m", "tests.support.soak_producer", "--bootstrap", self.bootstrap,
            "--topics", ",".join(self.topics), "--partitions", str(self.partitions),
            "--seed", self.seed, "--prefix", self.prefix, "--log", str(self.log_path),
            "--rate", str(self.rate),
        ]  # fmt: skip
        errors = self.log_path.with_suffix(".stderr")
        with errors.open("ab") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=out)  # fmt: skip
        self.instances += 1

    def kill_and_restart(self) -> None:
        """SIGKILL the running instance (sends in flight become maybes) and start another."""
        self.kill()
        self.start()

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM: it flushes and writes ``end``; return its exit status (None: it hung)."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL and reap (also the cleanup path)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def alive(self) -> bool:
        """Whether the current instance still runs."""
        return self.proc is not None and self.proc.poll() is None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", required=True, help="per-event,batch,async topics")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--seed", required=True)
    parser.add_argument("--prefix", required=True, help="event ids are <prefix>-<n>")
    parser.add_argument("--log", required=True)
    parser.add_argument("--rate", type=float, default=100.0, help="new events a second")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
