"""The invariant checker of the fault suite: counted in the database, read back from the broker.

After a scenario's final drain, :func:`check_invariants` measures the outcome
(effect rows per event, ``processed_events`` statuses, committed offsets,
dead-letter records, delivery logs) and :func:`assert_invariants` fails with
specifics if docs/design.md's invariants 1-3 and 5 do not hold. While the fault
happens, :class:`OffsetSampler` checks invariant 2 in the background.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

import psycopg
from confluent_kafka import KafkaException
from psycopg import sql

from tests.support.records import Produced, Read, committed, dead_letter_id, key_of, read_topic
from tests.support.workers import WorkerFactory, read_deliveries


def effect_counts(database_url: str, schema: str, table: str = "effects") -> Counter[str]:
    """How many effect rows each event id has."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT event_id, count(*) FROM {}.{} GROUP BY event_id").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
        ).fetchall()
    return Counter({r[0]: int(r[1]) for r in rows})


def effects_by_pid(database_url: str, schema: str, table: str = "effects") -> dict[int, int]:
    """How many effect rows each worker process (by pid) wrote."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT pid, count(*) FROM {}.{} GROUP BY pid").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
        ).fetchall()
    return {int(pid): int(n) for pid, n in rows}


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


def offsets_behind_database(
    database_url: str, schema: str, bootstrap: str, group: str, produced: Produced
) -> list[str]:
    """Invariant 2, sampled once: records below a committed offset whose id is not in the DB.

    Offsets are read *before* the database: both only grow, so anything the
    database lacks at the later read it also lacked when the offset was seen.
    """
    offsets = committed(bootstrap, group, produced.topic, produced.partitions)
    return _behind(offsets, set(processed(database_url, schema, group)), produced)


def _behind(offsets: dict[int, int], done: set[str], produced: Produced) -> list[str]:
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

    Args:
        produced: the records the group consumes; ``None`` when they are
            known only at the end (a relay publishes them): each sample is
            then kept and judged by :meth:`violations`, given the records.
        topic: the topic, when ``produced`` is ``None``.
        partitions: its partition count, when ``produced`` is ``None``.
        monotonic: also report a committed offset that moves back (a zombie
            member's stale commit getting through, say); only where nothing
            resets offsets on purpose.
    """

    def __init__(
        self, database_url: str, schema: str, bootstrap: str, group: str,
        produced: Produced | None, interval: float = 0.5, *, topic: str = "",
        partitions: int = 0, monotonic: bool = False,
    ) -> None:  # fmt: skip
        self._database_url, self._schema, self._group = database_url, schema, group
        self._bootstrap = bootstrap
        self._produced = produced
        self._topic = produced.topic if produced else topic
        self._partitions = produced.partitions if produced else partitions
        self._monotonic = monotonic
        self._interval = interval
        self._stop = threading.Event()
        self._found: list[str] = []
        self._kept: list[tuple[dict[int, int], set[str]]] = []
        self._last: dict[int, int] = {}
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="offset-sampler", daemon=True)

    def _sample(self) -> None:
        try:
            # The offsets first: see offsets_behind_database.
            offsets = committed(self._bootstrap, self._group, self._topic, self._partitions)
            done = set(processed(self._database_url, self._schema, self._group))
        except (AssertionError, psycopg.Error, KafkaException):
            return  # a service is down right now: that is the fault, not a finding
        self.samples += 1
        if self._monotonic:
            self._found += [
                f"partition {p}'s committed offset went back from {self._last[p]} to {o}"
                for p, o in sorted(offsets.items())
                if o < self._last.get(p, -1)
            ]
            self._last.update(offsets)
        if self._produced is None:
            self._kept.append((offsets, done))
        else:
            self._found.extend(_behind(offsets, done, self._produced))

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

    def violations(self, produced: Produced | None = None) -> list[str]:
        """Invariant-2 violations seen while sampling (``produced``: if unknown until now)."""
        found = list(self._found)
        if produced is not None:
            for offsets, done in self._kept:
                found.extend(_behind(offsets, done, produced))
        return found


def order_violations(
    database_url: str, schema: str, table: str = "effects", keys: int = 0
) -> list[str]:
    """Invariant 3: per partition (per key of a partition, given ``keys``), effects in offset order.

    The effect table's ``seq`` is the order handlers inserted in; a handler
    runs only after its claim, which waits for any other transaction holding
    the same ids, so ``seq`` order is application order. Only an event's first
    effect row counts (a second one is reported as applied twice anyway).
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL('SELECT partition, "offset", event_id FROM {}.{} ORDER BY seq').format(
                sql.Identifier(schema), sql.Identifier(table)
            )
        ).fetchall()
    seen: set[str] = set()
    last: dict[tuple[int, str], int] = {}
    found = []
    for partition, offset, event_id in rows:
        if event_id in seen:
            continue
        seen.add(event_id)
        where = (partition, key_of(event_id, keys) if keys else "")
        if offset <= last.get(where, -1):
            found.append(
                f"partition {partition}{f' key {where[1]}' if keys else ''}: offset {offset} "
                f"({event_id!r}) applied after offset {last[where]}"
            )
        last[where] = max(last.get(where, -1), offset)
    return found


@dataclass(frozen=True)
class Outcome:
    """The measured result of one scenario run (a scoreboard row's numbers).

    ``dead_lettered`` counts ``processed_events`` rows with that status,
    ``dead_letters`` the records read back from the dead-letter topic.
    """

    produced: int
    events: int
    deliveries: int
    applied_once: int
    duplicates_suppressed: int
    dead_lettered: int
    lost: list[str]
    applied_twice: dict[str, int]
    offsets: dict[int, int]
    dead_letters: list[Read] = field(default_factory=list)
    dead_ids: frozenset[str] = frozenset()
    out_of_order: list[str] = field(default_factory=list)


def check_invariants(
    factory: WorkerFactory,
    produced: Produced,
    *,
    table: str = "effects",
    dlq_topic: str | None = None,
) -> Outcome:
    """After a final drain: measure effects, statuses, offsets, dead letters and order.

    Returns the measured :class:`Outcome`; the caller asserts on it (so the
    scoreboard row is recorded even when the run fails). ``dlq_topic``
    defaults to kinbox's ``<topic>.dlq``.
    """
    effects = effect_counts(factory.database_url, factory.schema, table)
    status = processed(factory.database_url, factory.schema, factory.group)
    offsets = committed(factory.bootstrap, factory.group, produced.topic, produced.partitions)
    deliveries = read_deliveries(factory.log_dir)
    letters = read_topic(factory.bootstrap, dlq_topic or f"{produced.topic}.dlq")
    ids = produced.ids
    dead = frozenset(i for i, s in status.items() if s == "dead_lettered")
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
        dead_letters=letters,
        dead_ids=dead,
        out_of_order=order_violations(factory.database_url, factory.schema, table, produced.keys),
    )


def assert_invariants(
    outcome: Outcome,
    produced: Produced,
    factory: WorkerFactory,
    sampler_violations: list[str],
    *,
    expect_dead: frozenset[str] = frozenset(),
    dead_letter_copies: int = 1,
    replayed: frozenset[str] = frozenset(),
) -> None:
    """Fail with specifics if any of docs/design.md's invariants 1, 2, 3, 5 does not hold.

    ``replayed``: event ids whose dead letters were replayed and applied:
    their letters stay on the topic, their rows say ``applied``.

    ``expect_dead``: the event ids that must end dead-lettered (and only
    those): each with no effect row and one dead letter on the topic — or up
    to ``dead_letter_copies`` where a scenario crashes between a dead
    letter's acknowledgement and its batch's COMMIT (dead letters are
    at-least-once), every copy then from the same original record — or, for
    an id the producer sent more than once, from any record carrying it
    (records of one id in different partitions may be in flight at once,
    each given up before the other's verdict is committed), up to
    ``dead_letter_copies`` per such record.
    """
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
    problems += _dead_letter_problems(
        outcome, produced, factory, expect_dead, dead_letter_copies, replayed
    )
    problems += outcome.out_of_order[:10]
    behind = offsets_behind_database(
        factory.database_url, factory.schema, factory.bootstrap, factory.group, produced
    )
    problems += behind[:10] + sampler_violations[:10]
    if problems:
        logs = "\n".join(w.log_tail(25) for w in factory.started)
        raise AssertionError("invariants violated:\n  " + "\n  ".join(problems) + "\n" + logs)


def _dead_letter_problems(
    outcome: Outcome,
    produced: Produced,
    factory: WorkerFactory,
    expect_dead: frozenset[str],
    copies: int,
    replayed: frozenset[str] = frozenset(),
) -> list[str]:
    """Invariant 5: what was given up is in the DLQ (``copies`` at most), recorded, not applied."""
    problems = []
    if outcome.dead_ids != expect_dead:
        problems.append(
            f"dead-lettered {sorted(outcome.dead_ids)[:10]} but expected "
            f"{sorted(expect_dead)[:10]} (unexpected: {sorted(outcome.dead_ids - expect_dead)[:5]}"
            f", missing: {sorted(expect_dead - outcome.dead_ids)[:5]})"
        )
    per_id = Counter(dead_letter_id(letter) for letter in outcome.dead_letters)
    if set(per_id) != set(outcome.dead_ids) | replayed:
        problems.append(
            f"dead-letter topic holds {sorted(per_id)[:10]}, processed_events says "
            f"{sorted(outcome.dead_ids)[:10]}"
        )
    carriers: dict[str, set[tuple[str | None, ...]]] = {}
    for (partition, offset), event_id in produced.records.items():
        carriers.setdefault(event_id, set()).add((produced.topic, str(partition), str(offset)))
    again = {i: n for i, n in per_id.items() if n > copies * max(1, len(carriers.get(i, ())))}
    if again:
        problems.append(f"dead-lettered more than {copies} time(s) per record: {again}")
    origins: dict[str, set[tuple[str | None, ...]]] = {}
    for letter in outcome.dead_letters:
        origin = tuple(letter.header(f"kinbox.dlq.{h}") for h in ("topic", "partition", "offset"))
        origins.setdefault(dead_letter_id(letter), set()).add(origin)
    mixed = {
        i: sorted(map(str, o))
        for i, o in origins.items()
        if len(o) > 1 and not o <= carriers.get(i, set())
    }
    if mixed:
        problems.append(f"copies of one dead letter from records not carrying its id: {mixed}")
    effects = effect_counts(factory.database_url, factory.schema)
    applied = sorted(i for i in outcome.dead_ids if effects.get(i, 0))
    if applied:
        problems.append(f"dead-lettered yet applied: {applied[:10]}")
    return problems
