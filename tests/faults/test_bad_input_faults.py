"""Scenarios 10-11: poison events and malformed event ids (docs/design.md invariant 5).

Bad input never stops a worker silently and is never lost: it ends in the
dead-letter topic (read back here, ``kinbox.dlq.*`` headers checked), its
``processed_events`` row says ``dead_lettered``, and the partition moves on.
Under ``--missing-id derive`` a record without a valid id is applied once
under ``topic/partition/offset``; under ``--missing-id fail`` the worker stops
with a clear message and commits nothing past the record.
"""

from __future__ import annotations

import re

from tests.support.fault_run import Run
from tests.support.records import Headers, committed, dead_letter_id, read_topic
from tests.support.scenario import scenario
from tests.support.workers import read_deliveries


def _story(log: str, where: tuple[int, int]) -> str:
    """The worker's log lines about the record at ``where`` (partition, offset): its tries."""
    mark = re.compile(rf"\[{where[0]}\]@{where[1]}\b")
    return "\n".join(line for line in log.splitlines() if mark.search(line)) or "(none)"


EXIT_BAD_INPUT = 6
"""``kinbox worker``'s exit status after ``missing_id=fail`` stopped it (kinbox.cli.main)."""

# Each kind of malformed id, and what kinbox's dead letter must say about it.
MALFORMED: dict[str, tuple[Headers, str]] = {
    "missing": ([("trace", b"no id here")], "no event id header"),
    "empty": ([("event-id", b"")], "is empty"),
    "non-utf8": ([("event-id", b"\xff\xfe\xfd")], "is not UTF-8"),
    "oversize": ([("event-id", b"x" * 256)], "is 256 bytes, at most 255"),
    "ambiguous": ([("event-id", b"amb-1"), ("event-id", b"amb-2")], "repeated with different"),
}


@scenario("10", "poison events", fault="handler always fails some ids")
def test_poison_events_end_in_the_dead_letter_topic_only(run: Run) -> None:
    every = run.rng.choice([29, 41, 53])
    max_attempts = run.rng.randint(2, 3)
    produced = run.produce(duplicates=run.rng.randint(0, 10))
    poison = frozenset(i for i in produced.ids if int(i.rsplit("-", 1)[1]) % every == 0)
    run.expect_dead = poison
    with run.sampling():
        # Given a handler that can never apply every `every`-th event
        worker = run.factory.start(
            "victim",
            env={"FAULT_POISON_EVERY": str(every), "FAULT_SLEEP": "0.001"},
            args=["--max-attempts", str(max_attempts)],
        )
        # Then the worker gives each up after max_attempts and moves on
        run.wait_caught_up(worker)
        assert worker.stop() == 0, worker.log_tail()
    tries = read_deliveries(run.log_dir).attempts
    outcome = run.finish()
    # (finish() checked: only these are dead-lettered, once each, none applied)
    positions: dict[str, set[tuple[int, int]]] = {}
    for where, event_id in produced.records.items():
        positions.setdefault(event_id, set()).add(where)
    for letter in outcome.dead_letters:
        event_id = dead_letter_id(letter)
        origin = (
            int(letter.header("kinbox.dlq.partition") or -1),
            int(letter.header("kinbox.dlq.offset") or -1),
        )
        assert letter.header("kinbox.dlq.topic") == run.topic, letter
        assert origin in positions[event_id], (origin, positions[event_id])
        assert letter.header("kinbox.dlq.attempts") == str(max_attempts), letter
        assert letter.header("kinbox.dlq.reason") == "handler-error", letter
        assert letter.header("kinbox.dlq.error.type") == "PoisonError", letter
        assert letter.header("kinbox.dlq.consumer") == run.group, letter
        assert letter.value == b'{"n": 1}' and letter.header("event-id") == event_id
        # The record dead-lettered was tried exactly max_attempts times, counted 1..max_attempts
        assert tries[origin] == list(range(1, max_attempts + 1)), (
            origin,
            tries[origin],
            _story(worker.log(), origin),
        )
    # A producer's duplicate of a poison id on another partition may be tried too:
    # while one record's failed try rolls its claim back, the other's claim can
    # take the id. It counts its own tries, never past max_attempts, and is
    # suppressed once the id is dead-lettered (finish() checked: one letter).
    for where, event_id in produced.records.items():
        if event_id in poison:
            own = tries.get(where, [])
            assert own == list(range(1, len(own) + 1)) and len(own) <= max_attempts, (where, own)


def _malformed_stream(run: Run) -> dict[tuple[int, int], str]:
    """Good events with one record of each malformed kind mixed in, never first in its
    partition; plus an id header repeated with *equal* values, which is valid.

    Every bad record carries a ``fault-kind`` header (not an id header).
    Returns ``(partition, offset) -> kind`` of the bad records, read back from the topic.
    """
    count = run.rng.randint(100, 150)
    items: list[tuple[int, Headers, str | None]] = []
    for n in range(count):
        event_id = f"{run.group}-ev-{n}"
        items.append((n % run.partitions, [("event-id", event_id.encode())], event_id))
    equal = f"{run.group}-ev-equal".encode()
    at = run.rng.randrange(run.partitions, len(items))
    items.insert(at, (0, [("event-id", equal), ("event-id", equal)], equal.decode()))
    for kind, (headers, _) in MALFORMED.items():
        at = run.rng.randrange(run.partitions, len(items))
        partition = run.rng.randrange(run.partitions)
        items.insert(at, (partition, [*headers, ("fault-kind", kind.encode())], None))
    run.produce_plan(items)
    kinds = {
        (r.partition, r.offset): r.header("fault-kind") or ""
        for r in read_topic(run.bootstrap, run.topic)
        if r.header("fault-kind")
    }
    assert sorted(kinds.values()) == sorted(MALFORMED), kinds
    assert all(offset > 0 for _, offset in kinds), kinds
    return kinds


@scenario("11a", "malformed ids dead-letter", fault="malformed ids, dead-letter")
def test_malformed_ids_are_dead_lettered_by_default(run: Run) -> None:
    bad = _malformed_stream(run)
    run.expect_dead = frozenset(f"{run.topic}/{p}/{o}" for p, o in bad)
    with run.sampling():
        # Given the default policy, When the worker meets the bad records
        worker = run.factory.start("victim")
        # Then it dead-letters them and moves on
        run.wait_caught_up(worker)
        assert worker.stop() == 0, worker.log_tail()
    outcome = run.finish()
    for letter in outcome.dead_letters:
        origin = (
            int(letter.header("kinbox.dlq.partition") or -1),
            int(letter.header("kinbox.dlq.offset") or -1),
        )
        kind = bad[origin]
        assert letter.header("fault-kind") == kind, letter
        assert letter.header("kinbox.dlq.reason") == "invalid-id", letter
        assert letter.header("kinbox.dlq.error.type") == "EnvelopeError", letter
        assert letter.header("kinbox.dlq.attempts") == "0", letter
        assert MALFORMED[kind][1] in (letter.header("kinbox.dlq.error.message") or ""), (
            kind,
            letter.header("kinbox.dlq.error.message"),
        )
    assert f"{run.group}-ev-equal" not in outcome.lost


@scenario("11b", "malformed ids derive", fault="malformed ids, --missing-id derive")
def test_malformed_ids_applied_once_under_derive(run: Run) -> None:
    bad = _malformed_stream(run)
    derive = ["--missing-id", "derive"]
    with run.sampling():
        worker = run.factory.start("victim", args=derive)
        run.wait_caught_up(worker)
        assert worker.stop() == 0, worker.log_tail()
    # Then each bad record is applied once, keyed on topic/partition/offset
    # (finish() checks every expected id has exactly one effect row)
    outcome = run.finish(drain_args=derive)
    assert outcome.applied_once == outcome.events, outcome
    assert not outcome.dead_letters, outcome.dead_letters
    assert len(bad) == len(MALFORMED)


@scenario("11c", "malformed ids fail", fault="malformed ids, --missing-id fail")
def test_malformed_id_stops_the_worker_under_fail(run: Run) -> None:
    bad = _malformed_stream(run)
    with run.sampling():
        # Given --missing-id fail, When the worker meets a bad record
        worker = run.factory.start("victim", args=["--missing-id", "fail"])
        status = worker.wait(60)
        # Then it exits with the bad-input status and names the record
        log = worker.log()
        assert status == EXIT_BAD_INPUT, worker.log_tail()
        found = re.search(r"missing_id=fail: .*committed up to (\S+)\[(\d+)\]@(\d+)", log)
        assert found, worker.log_tail()
        assert found.group(1) == run.topic, found.group(0)
        stopped_at = (int(found.group(2)), int(found.group(3)))
        assert stopped_at in bad, (stopped_at, bad)
        assert MALFORMED[bad[stopped_at]][1] in found.group(0), found.group(0)
        # and has committed exactly up to it, and nowhere past any bad record
        got = committed(run.bootstrap, run.group, run.topic, run.partitions)
        assert got.get(stopped_at[0]) == stopped_at[1], (got, stopped_at)
        for partition, offset in bad:
            assert got.get(partition, 0) <= offset, (got, partition, offset)
    # When the operator switches to dead-lettering, the stream drains
    run.expect_dead = frozenset(f"{run.topic}/{p}/{o}" for p, o in bad)
    run.finish(drain_args=["--missing-id", "dead-letter"])
