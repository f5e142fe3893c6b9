"""The business effect every contender writes, and the check that each run must pass.

One row per applied event in a table of the run's own (no unique key on the
event id, on purpose: an event applied twice is two rows). The check compares
the rows with the distinct events delivered:

- an **exactly-once** contender passes when every event has exactly one row;
- an **at-least-once** contender (the inbox turned off) passes when every event
  has at least one row; the rows beyond that are reported as *duplicates
  applied*, never hidden in a throughput figure.

A run that fails its check raises :class:`CheckFailed`: loud, and never a figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from kinbox.bench.results import percentiles
from kinbox.core.errors import KinboxError

COLUMNS = ("event_id", "partition", "offset", "user_id", "lesson_id", "sent_at")
"""What a handler writes per event (``applied_at`` fills itself)."""


class CheckFailed(KinboxError):
    """A run's effects do not match what its contender promises."""


def create_table(conn: psycopg.Connection[Any], schema: str, table: str) -> None:
    """Create an empty effect table.

    ``applied_at`` is the server's ``clock_timestamp()`` when the row was
    written; the latency scenario prefers the transaction's commit time
    (:func:`commit_time_available`).
    """
    conn.execute(
        sql.SQL(
            "CREATE TABLE {}.{} (event_id text NOT NULL, partition int NOT NULL,"
            ' "offset" bigint NOT NULL, user_id text NOT NULL, lesson_id text NOT NULL,'
            " sent_at double precision NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(sql.Identifier(schema), sql.Identifier(table))
    )


def insert_one(schema: str, table: str) -> sql.Composed:
    """``INSERT`` of one effect row: parameters in :data:`COLUMNS` order."""
    return sql.SQL("INSERT INTO {}.{} ({}) VALUES (%s, %s, %s, %s, %s, %s)").format(
        sql.Identifier(schema), sql.Identifier(table), _columns()
    )


def insert_many(schema: str, table: str) -> sql.Composed:
    """One set-based ``INSERT`` of many effect rows: one array per column of :data:`COLUMNS`."""
    return sql.SQL(
        "INSERT INTO {}.{} ({}) SELECT * FROM unnest("
        "%s::text[], %s::int[], %s::bigint[], %s::text[], %s::text[], %s::float8[])"
    ).format(sql.Identifier(schema), sql.Identifier(table), _columns())


def _columns() -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS)


@dataclass(frozen=True)
class EffectTally:
    """What a run left in its effect table."""

    rows: int
    distinct: int

    def check(self, expected: int, *, exactly_once: bool) -> int:
        """Check against ``expected`` distinct events; return the duplicates applied.

        Raises:
            CheckFailed: an event is missing, or (exactly once) one was applied twice.
        """
        if self.distinct != expected:
            raise CheckFailed(
                f"{expected - self.distinct} of {expected} events have no effect "
                f"({self.distinct} distinct events applied, {self.rows} rows)"
            )
        duplicates = self.rows - self.distinct
        if exactly_once and duplicates:
            raise CheckFailed(
                f"{duplicates} duplicate effects: {self.rows} rows for {expected} events "
                "(exactly once means one row per event)"
            )
        return duplicates


def tally(conn: psycopg.Connection[Any], schema: str, table: str) -> EffectTally:
    """Count the rows and distinct events in an effect table."""
    row = conn.execute(
        sql.SQL("SELECT count(*), count(DISTINCT event_id) FROM {}.{}").format(
            sql.Identifier(schema), sql.Identifier(table)
        )
    ).fetchone()
    assert row is not None
    return EffectTally(int(row[0]), int(row[1]))


def frontier(
    conn: psycopg.Connection[Any], schema: str, table: str, since: float | None = None
) -> dict[int, int]:
    """Per partition, one past the highest offset with a committed effect.

    Right after a contender is killed between its database commit and its
    offset commit, the records from the committed offset up to here are the
    batch that will be delivered again. With ``since`` (seconds since the
    epoch on the server's clock, :func:`server_time`) only the effects written
    from then on count: what one process applied, if it started then.
    """
    after = sql.SQL("") if since is None else sql.SQL(" WHERE applied_at >= to_timestamp(%s)")
    rows = conn.execute(
        sql.SQL('SELECT partition, max("offset") + 1 FROM {}.{}{} GROUP BY partition').format(
            sql.Identifier(schema), sql.Identifier(table), after
        ),
        () if since is None else (since,),
    ).fetchall()
    return {int(p): int(o) for p, o in rows}


def server_time(conn: psycopg.Connection[Any]) -> float:
    """The server's clock now, in seconds since the epoch (what ``applied_at`` is written by)."""
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def commit_time_available(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server records commit times (``track_commit_timestamp = on``)."""
    row = conn.execute("SHOW track_commit_timestamp").fetchone()
    return bool(row and row[0] == "on")


def clock_offset(conn: psycopg.Connection[Any], samples: int = 7) -> float:
    """Seconds the server's clock is ahead of this machine's, from the fastest round trip."""
    import time

    best: tuple[float, float] | None = None
    for _ in range(samples):
        before = time.time()
        server = server_time(conn)
        after = time.time()
        if best is None or after - before < best[0]:
            best = (after - before, server - (before + after) / 2)
    assert best is not None
    return best[1]


@dataclass(frozen=True)
class Latency:
    """Produce → effect committed, in milliseconds; and broker append → committed, if known."""

    p50: float
    p99: float
    samples: int
    method: str
    append_p50: float | None = None
    """From the broker's append to the commit (the consumer's leg), if append times were given."""
    append_p99: float | None = None
    append_samples: int = 0


def latency(
    conn: psycopg.Connection[Any],
    schema: str,
    table: str,
    *,
    skip_before: float,
    appended: Mapping[tuple[int, int], float] | None = None,
) -> Latency:
    """Latency of the effects of events produced at ``skip_before`` or later (after warm-up).

    "Committed" is the commit time of the transaction that wrote the effect
    (``pg_xact_commit_timestamp(xmin)``) when the server tracks it; otherwise
    the row's ``clock_timestamp()`` at insert, a lower bound that misses the
    rest of the batch and the COMMIT's fsync (the report says which). Server
    times are moved onto this machine's clock with :func:`clock_offset`.

    ``appended`` (``(partition, offset) →`` the broker's append time, see
    :func:`kinbox.bench.workload.produce`) splits off the producer's leg:
    the ``append_*`` figures run from the broker's append. The broker's
    clock is taken as this machine's (true of a local stack; against a
    remote cluster they are off by the clocks' skew).
    """
    exact = commit_time_available(conn)
    when = "pg_xact_commit_timestamp(xmin)" if exact else "applied_at"
    rows = conn.execute(
        sql.SQL(
            'SELECT partition, "offset", sent_at, extract(epoch FROM {})::float8'
            " FROM {}.{} WHERE sent_at >= %s"
        ).format(sql.SQL(when), sql.Identifier(schema), sql.Identifier(table)),
        (skip_before,),
    ).fetchall()
    offset = clock_offset(conn)
    committed = [(int(p), int(o), float(sent), float(at) - offset) for p, o, sent, at in rows]
    values = [1000 * (at - sent) for _, _, sent, at in committed]
    if len(values) < 2:
        raise CheckFailed(f"latency: only {len(values)} effects after the warm-up")
    p50, p99 = percentiles(values)
    method = "commit timestamp" if exact else "insert time (lower bound)"
    legs = [
        1000 * (at - appended[(p, o)])
        for p, o, _, at in committed
        if appended is not None and (p, o) in appended
    ]
    if len(legs) < 2:
        return Latency(p50, p99, len(values), method)
    a50, a99 = percentiles(legs)
    return Latency(p50, p99, len(values), method, a50, a99, len(legs))


@dataclass(frozen=True)
class Timed:
    """One effect row's times, seconds since the epoch on this machine's clock."""

    partition: int
    offset: int
    sent: float
    """The producer's clock when it called ``produce()``."""
    inserted: float
    """The handler's ``INSERT`` (the row's ``clock_timestamp()``)."""
    committed: float | None
    """Its transaction's commit (``None`` without ``track_commit_timestamp``)."""


def timed(conn: psycopg.Connection[Any], schema: str, table: str) -> list[Timed]:
    """Every effect row's times, the server's moved onto this machine's clock."""
    exact = commit_time_available(conn)
    committed = sql.SQL(
        "extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8" if exact else "NULL::float8"
    )
    rows = conn.execute(
        sql.SQL(
            'SELECT partition, "offset", sent_at, extract(epoch FROM applied_at)::float8, {}'
            " FROM {}.{}"
        ).format(committed, sql.Identifier(schema), sql.Identifier(table))
    ).fetchall()
    offset = clock_offset(conn)
    return [
        Timed(int(p), int(o), float(s), float(i) - offset, None if c is None else float(c) - offset)
        for p, o, s, i, c in rows
    ]


def gap(frontier_: Mapping[int, int], committed: Mapping[int, int]) -> int:
    """Records between the committed offsets and the database frontier: the redelivered batch."""
    return sum(max(0, end - committed.get(p, 0)) for p, end in frontier_.items())


def redelivered(
    reached: Mapping[int, int], own: Mapping[int, int], committed: Mapping[int, int],
    *, exactly_once: bool,
) -> int:  # fmt: skip
    """Records a member killed after its database commit had applied past its committed offsets.

    They are what it hands over to be delivered again. Only what *this*
    member applied counts (``own``: its frontier, :func:`frontier` since it
    started): the effects past the committed offsets may also hold a batch of
    an earlier member that this one was killed before reaching, and that
    batch is delivered again once, not once per kill. A member consumes each
    partition in offset order from the committed offset, so where it wrote
    an effect it went through everything below it.

    An exactly-once member whose own effects are all below the committed
    offsets was killed after a batch its claim suppressed whole (a repeat of
    an earlier member's batch), which leaves no trace in the table: then
    everything past the committed offsets (``reached``) is counted, as a
    restarted member with the backlog in hand re-reads it.

    Args:
        reached: :func:`frontier` of every effect.
        own: :func:`frontier` of the killed member's effects.
        committed: the group's committed offsets after the kill.
        exactly_once: the contender suppresses duplicates (so writes no effect for them).
    """
    mine = gap(own, committed)
    if mine or not exactly_once:
        return mine
    return gap(reached, committed)
