"""Scenario 13: content the database refuses, in real worker processes (docs/design.md invariant 5).

The handler writes values taken from each payload into columns PostgreSQL
checks (:data:`tests.support.effect_app.VALUES_DDL`). A seeded share of the
events carry values it refuses: too long for ``varchar(8)``, out of
``integer``'s range, a NUL, an index row over the btree limit — refused in the
handler's statement — or a unique key an earlier event of the partition holds,
under a deferred constraint, so refused only at COMMIT, where no statement
names the event. Some records carry a NUL in their event id, which
PostgreSQL cannot store. A second worker joins mid-stream (a rebalance while
batches are being narrowed down).

Every refused event must be dead-lettered after its tries (once, on the
dead-letter topic) and every other event applied exactly once; the
partitions reach their end.
"""

from __future__ import annotations

import json

import psycopg
from psycopg import sql

from tests.support.effect_app import VALUES_DDL
from tests.support.fault_run import Run
from tests.support.rawkafka import RawRecord, produce_raw
from tests.support.records import Produced
from tests.support.scenario import scenario

TABLE = "fault_values"
MAX_ATTEMPTS = 2


def _refused(run: Run, n: int, kind: str) -> dict[str, object]:
    """The payload fields of a refused event of ``kind``."""
    if kind == "varchar":
        return {"short": "x" * run.rng.randint(9, 40)}
    if kind == "integer":
        return {"n": run.rng.choice([2**31, -(2**31) - 1, 2**40])}
    if kind == "nul":
        return {"note": f"before \x00 after {n}"}
    # random hex does not compress: an index row over btree's 2704 bytes
    return {"big": run.rng.randbytes(run.rng.randint(1500, 3000)).hex()}


def _keyed(record: RawRecord) -> bool:
    return "key" in json.loads(record.value or b"{}")


def _stream(run: Run, count: int) -> tuple[list[RawRecord], list[str | None], set[int]]:
    """The records, their expected ids (``None``: malformed), and the indexes that are refused.

    Unique keys are shared only within a partition, where order decides the
    winner; duplicates repeat only events that nothing refuses.
    """
    records: list[RawRecord] = []
    ids: list[str | None] = []
    refused: set[int] = set()
    held: dict[int, list[str]] = {p: [] for p in range(run.partitions)}
    for n in range(count):
        partition, event_id = n % run.partitions, f"{run.group}-ev-{n}"
        fields: dict[str, object] = {"short": "ok", "n": n, "note": "fine", "big": "small"}
        roll = run.rng.random()
        if roll < 0.08:
            fields.update(_refused(run, n, run.rng.choice(["varchar", "integer", "nul", "big"])))
            refused.add(n)
        elif roll < 0.12 and held[partition]:
            fields["key"] = run.rng.choice(held[partition])  # refused at COMMIT
            refused.add(n)
        elif roll < 0.2:
            fields["key"] = f"key-{n}"
            held[partition].append(f"key-{n}")
        headers: list[tuple[bytes, bytes | None]] = [(b"event-id", event_id.encode())]
        if 0.2 <= roll < 0.22:
            headers = [(b"event-id", f"nul\x00{n}".encode())]  # malformed: dead-lettered
            ids.append(None)
        else:
            ids.append(event_id)
        records.append(RawRecord(partition, json.dumps(fields).encode(), headers))
    for _ in range(run.rng.randint(0, 10)):
        # Chosen afresh after each insert: the indexes shift.
        plain = [i for i, r in enumerate(records) if ids[i] and i not in refused and not _keyed(r)]
        copy = records[run.rng.choice(plain)]
        at = run.rng.randrange(len(records) + 1)
        records.insert(at, RawRecord(run.rng.randrange(run.partitions), copy.value, copy.headers))
        ids.insert(at, copy.headers[0][1].decode() if copy.headers[0][1] else None)
        refused = {i + 1 if i >= at else i for i in refused}
    return records, ids, refused


@scenario("13", "content the database refuses", fault="values postgres refuses")
def test_content_the_database_refuses(run: Run) -> None:
    with psycopg.connect(run.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL(VALUES_DDL).format(sql.Identifier(run.schema), sql.Identifier(TABLE)))
    records, ids, refused = _stream(run, run.events // 2)
    offsets = produce_raw(run.bootstrap, run.topic, records)
    placed = {}
    dead: set[str] = set()
    for i, (record, offset) in enumerate(zip(records, offsets, strict=True)):
        event_id = ids[i] or f"{run.topic}/{record.partition}/{offset}"
        placed[(record.partition, offset)] = event_id
        if ids[i] is None or i in refused:
            dead.add(event_id)
    run.produced = Produced(run.topic, run.partitions, placed)
    run.expect_dead = frozenset(dead)
    env = {"FAULT_VALUES": TABLE}
    args = ["--max-attempts", str(MAX_ATTEMPTS)]
    with run.sampling():
        # Given workers whose handler writes what the payloads say
        first = run.factory.start("first", env=env, args=args)
        run.wait_handler_calls(len(records) // 4)
        # When a second member joins while refusals are being narrowed down
        second = run.factory.start("second", env=env, args=args)
        # Then the group gets past every record: refused ones dead-lettered
        run.wait_caught_up(first, second)
        assert first.stop() == 0, first.log_tail()
        assert second.stop() == 0, second.log_tail()
    outcome = run.finish(drain_args=args)
    # (finish() checked: only these dead-lettered, once each, none applied;
    # every other event applied once; offsets at the end)
    assert outcome.dead_lettered == len(dead) > 0, outcome
    reasons = {letter.header("kinbox.dlq.reason") for letter in outcome.dead_letters}
    assert reasons <= {"handler-error", "invalid-id"}, reasons
