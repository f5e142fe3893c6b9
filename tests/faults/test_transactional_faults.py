"""Scenarios 21a-21b: logs with offsets that hold no record for kinbox to apply.

21a: upstream producers use transactions. Some commit, some abort, and one
stays open for a while, with a committed transaction behind it. kinbox reads
``read_committed``: an aborted record is never applied (nor recorded in
``processed_events``); behind the open transaction the worker waits at the
partition's last stable offset — polling, without errors, without spinning
(its CPU time is measured while it waits) — and once the transaction
commits, the committed offsets reach the end of the log, though each
transaction's marker takes an offset of its own.

21b: a compacted topic (``cleanup.policy=compact``, tiny segments, the log
cleaner woken every second) whose older values the cleaner removed, so the
offsets the worker reads have gaps; every record left is applied once and
the committed offsets reach the end of the log.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

# (re-exported by confluent_kafka.admin, but not in a way mypy --strict accepts)
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from tests.support.fault_run import Run
from tests.support.invariants import effect_counts, processed
from tests.support.records import Produced, committed, log_ends, read_topic
from tests.support.scenario import scenario
from tests.support.waiting import wait_for
from tests.support.workers import Worker, read_deliveries

WAIT = 5.0
"""Seconds the worker is watched while it waits behind the open transaction."""


class Transactions:
    """A transactional producer that remembers where each of its records landed."""

    def __init__(self, bootstrap: str, transactional_id: str, topic: str, partitions: int) -> None:
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
             "linger.ms": 5, "log_level": 3}
        )  # fmt: skip
        self._producer.init_transactions(60)
        self._topic, self._partitions = topic, partitions
        self.placed: dict[str, tuple[int, int]] = {}
        self.errors: list[str] = []

    def write(self, ids: list[str], *, end: str | None) -> None:
        """One transaction with a record per id, then ``commit``, ``abort`` or (None) left open."""
        self._producer.begin_transaction()
        for n, event_id in enumerate(ids):
            self._producer.produce(
                self._topic, value=b'{"n": 1}', partition=n % self._partitions,
                headers=[("event-id", event_id.encode())],
                on_delivery=functools.partial(self._delivered, event_id),
            )  # fmt: skip
        assert self._producer.flush(30) == 0 and not self.errors, self.errors
        if end == "commit":
            self._producer.commit_transaction(30)
        elif end == "abort":
            self._producer.abort_transaction(30)

    def commit(self) -> None:
        """Commit the transaction left open."""
        self._producer.commit_transaction(30)

    def close(self) -> None:
        """Release the producer."""
        self._producer.close()

    def _delivered(self, event_id: str, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.placed[event_id] = (msg.partition(), msg.offset())


def _transactions(run: Run, name: str) -> Transactions:
    return Transactions(run.bootstrap, f"{run.group}-{name}", run.topic, run.partitions)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@scenario("21a", "transactional producers upstream", fault="aborted + open transactions",
          partitions=2)  # fmt: skip
def test_aborted_records_never_apply_and_the_worker_waits_behind_an_open_one(run: Run) -> None:
    with contextlib.ExitStack() as producers:
        # (closed before the broker goes, so they do not call out after it)
        upstream, stalled = _transactions(run, "upstream"), _transactions(run, "stalled")
        producers.callback(upstream.close)
        producers.callback(stalled.close)
        _story(run, upstream, stalled)


def _story(run: Run, upstream: Transactions, stalled: Transactions) -> None:
    # Given committed and aborted transactions, one left open, one committed behind it
    committed_ids: list[str] = []
    aborted_ids: list[str] = []
    for n in range(run.rng.randint(12, 20)):
        ids = [f"{run.group}-tx{n}-{i}" for i in range(run.rng.randint(1, 12))]
        end = "abort" if run.rng.random() < 0.35 else "commit"
        upstream.write(ids, end=end)
        (committed_ids if end == "commit" else aborted_ids).extend(ids)
    open_ids = [f"{run.group}-open-{i}" for i in range(run.rng.randint(2, 6))]
    stalled.write(open_ids, end=None)
    late_ids = [f"{run.group}-late-{i}" for i in range(run.rng.randint(2, 6))]
    upstream.write(late_ids, end="commit")
    placed = {**upstream.placed, **stalled.placed}
    stable = {p: min(o for q, o in (placed[i] for i in open_ids) if q == p)
              for p in {placed[i][0] for i in open_ids}}  # fmt: skip
    # (the open transaction's records will commit; the aborted ones never will)
    kept = [*committed_ids, *open_ids, *late_ids]
    run.produced = Produced(run.topic, run.partitions, {placed[i]: i for i in kept})
    with run.sampling(monotonic=True):
        worker = run.factory.start("reader", env={"FAULT_SLEEP": "0.002"})
        # Then the worker applies what committed before the open transaction
        wait_for(
            lambda: committed(run.bootstrap, run.group, run.topic, run.partitions) == stable,
            60, f"committed offsets at the last stable offsets {stable}",
        )  # fmt: skip
        before = set(effect_counts(run.database_url, run.schema))
        assert before == set(committed_ids), sorted(before ^ set(committed_ids))[:10]
        # and waits there: no error, no spinning
        cpu, since = _cpu_seconds(worker.pid), time.monotonic()
        time.sleep(WAIT)
        busy = (_cpu_seconds(worker.pid) - cpu) / (time.monotonic() - since)
        print(f"[faults] scenario 21a: waiting behind the open transaction the worker used "
              f"{busy:.1%} of a core; {len(aborted_ids)} aborted, {len(committed_ids)} "
              f"committed records before it")  # fmt: skip
        assert busy < 0.35, f"the worker spins while it waits: {busy:.0%} of a core"
        assert set(effect_counts(run.database_url, run.schema)) == before
        assert committed(run.bootstrap, run.group, run.topic, run.partitions) == stable
        _assert_quiet(worker)
        # When the open transaction commits
        stalled.commit()
        ends = log_ends(run.bootstrap, run.topic, run.partitions)
        run.produced = Produced(run.topic, run.partitions, run.produced.records, ends=ends)
        # Then the committed offsets reach the end of the log, markers included
        run.wait_caught_up(worker)
        _assert_quiet(worker)
        assert worker.stop() == 0, worker.log_tail()
    _assert_never_seen(run, {i: placed[i] for i in aborted_ids})
    outcome = run.finish()
    assert outcome.offsets == ends, (outcome.offsets, ends)


def _assert_quiet(worker: Worker) -> None:
    noisy = [line for line in worker.log().splitlines() if " ERROR " in line or " WARNING " in line]
    assert not noisy, "\n".join(noisy[:10])


def _assert_never_seen(run: Run, aborted: dict[str, tuple[int, int]]) -> None:
    """No aborted record was delivered, applied or recorded."""
    delivered = set(read_deliveries(run.log_dir).records)
    assert delivered, "the delivery log is empty"
    handed = sorted(i for i, where in aborted.items() if where in delivered)
    applied = set(aborted) & set(effect_counts(run.database_url, run.schema))
    recorded = set(aborted) & set(processed(run.database_url, run.schema, run.group))
    assert not handed and not applied and not recorded, (handed[:5], applied, recorded)


def _compact(run: Run) -> None:
    """Make the round's topic compacted, with segments that roll at once; wake the cleaner."""
    admin = AdminClient({"bootstrap.servers": run.bootstrap})
    settings = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio":
                "0.01", "delete.retention.ms": "100", "min.compaction.lag.ms": "0"}  # fmt: skip
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
               for k, v in settings.items()]  # fmt: skip
    topic = ConfigResource(ConfigResource.Type.TOPIC, run.topic, incremental_configs=entries)
    # A dynamic broker default: the log cleaner looks for work every second, not every 15.
    backoff = ConfigEntry("log.cleaner.backoff.ms", "1000",
                          incremental_operation=AlterConfigOpType.SET)  # fmt: skip
    brokers = [ConfigResource(ConfigResource.Type.BROKER, str(node), incremental_configs=[backoff])
               for node in admin.list_topics(timeout=10).brokers]  # fmt: skip
    for future in admin.incremental_alter_configs([topic, *brokers]).values():
        future.result(timeout=30)


def _write_keyed(run: Run, items: list[tuple[str, str]], partition: int | None = None) -> None:
    """One record per (key, event id), partition by key, with an ``event-id`` header."""
    producer = Producer({"bootstrap.servers": run.bootstrap, "enable.idempotence": True,
                         "log_level": 3})  # fmt: skip
    for key, event_id in items:
        headers: list[tuple[str, str | bytes | None]] = [("event-id", event_id.encode())]
        if partition is None:
            producer.produce(run.topic, value=b'{"n": 1}', key=key.encode(), headers=headers)
        else:
            producer.produce(
                run.topic, value=b'{"n": 1}', key=key.encode(), partition=partition,
                headers=headers,
            )  # fmt: skip
        producer.poll(0)
        time.sleep(0.01)  # spread over many 100 ms segments
    assert producer.flush(30) == 0


@scenario("21b", "compacted topic with gaps", fault="log cleaner removed old values",
          partitions=2)  # fmt: skip
def test_a_compacted_topic_with_offset_gaps_applies_what_is_left_once(run: Run) -> None:
    # Given a compacted topic: keys written once between keys written again and again
    _compact(run)
    hot = [f"hot-{n}" for n in range(run.rng.randint(5, 15))]
    items = [
        (run.rng.choice(hot) if run.rng.random() < 0.7 else f"cold-{n}", f"{run.group}-c{n}")
        for n in range(run.rng.randint(300, 400))
    ]
    _write_keyed(run, items)
    time.sleep(0.3)
    # (a record of a key of its own in each partition: it rolls the last segment, so
    # the segment still open holds nothing the cleaner would remove)
    for partition in range(run.partitions):
        roll = [(f"roll-{partition}", f"{run.group}-roll-{partition}")]
        _write_keyed(run, roll, partition)
        items += roll
    last = {key: event_id for key, event_id in items}
    # When the log cleaner has removed every older value: what is left is final
    wait_for(
        lambda: {r.header("event-id") for r in read_topic(run.bootstrap, run.topic)}
        == set(last.values()),
        90, "the log cleaner to keep only each key's last value", interval=1.0,
    )  # fmt: skip
    left = read_topic(run.bootstrap, run.topic)
    ends = log_ends(run.bootstrap, run.topic, run.partitions)
    gaps = sum(ends[p] - len([r for r in left if r.partition == p]) for p in ends)
    print(f"[faults] scenario 21b: {len(items)} written, {len(left)} left, {gaps} offsets "
          "without a record")  # fmt: skip
    run.produced = Produced(
        run.topic, run.partitions, {(r.partition, r.offset): r.header("event-id") or "?"
                                    for r in left}, ends=ends,
    )  # fmt: skip
    with run.sampling(monotonic=True):
        # Then a worker applies every record left, once, and its offsets reach the log's end
        worker = run.factory.start("reader", batch_max_messages=run.rng.choice([5, 20, 50]))
        run.wait_caught_up(worker)
        assert worker.stop() == 0, worker.log_tail()
    outcome = run.finish()
    assert outcome.offsets == ends, (outcome.offsets, ends)
