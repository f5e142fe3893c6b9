"""The state of one schema's tables, and what differs between two such states.

The redelivery check (:mod:`kinbox.testing.redelivery`) runs the same events
into fresh schemas, with and without faults, and compares what the tables
hold at the end. A snapshot is every row of every table of the schema (each
value as text, ``NULL`` as ``None``), compared as a multiset: row order means
nothing. Two kinds of column are left out of the comparison, because their
values legitimately differ between two correct runs:

- columns filled from a sequence (identity and ``serial`` columns, any
  ``DEFAULT nextval(...)``) and the foreign keys that point at them: a
  rolled-back insert still uses up a sequence value, so a run with a
  crash numbers its rows differently;
- columns whose values differ between two *clean* runs of the same events
  (``now()``, a random uuid, ``clock_timestamp()``...): found by running the
  clean delivery twice.

kinbox's own ``schema_version``, ``reused_event_ids``, ``parked_keys`` and
``parked_events`` are ignored (the last three record positions and times,
which differ from run to run) and
``processed_events`` is compared on ``(event_id, status)`` only (the offsets
and times in it differ when duplicates are delivered).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from kinbox.core.errors import ConfigurationError

INBOX_TABLE = "processed_events"
"""kinbox's bookkeeping, compared on ``(event_id, status)``."""
SKIPPED = frozenset({"schema_version", "reused_event_ids", "parked_keys", "parked_events"})
"""kinbox's tables that are never compared."""

Row = tuple[str | None, ...]


@dataclass(frozen=True)
class Table:
    """A table of the schema, as the comparison sees it.

    Attributes:
        name: its name (the schema is the run's own).
        columns: its columns, in order.
        sequenced: columns filled from a sequence, or referring to one that
            is, with which.
    """

    name: str
    columns: tuple[str, ...]
    sequenced: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """Every row of every table of one schema, and the inbox's verdicts."""

    rows: Mapping[str, Counter[Row]]
    inbox: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass(frozen=True)
class TableDifference:
    """One table ends differently after a run with faults than after a clean run.

    Attributes:
        table: the table's name (``processed_events`` for kinbox's own rows).
        columns: the columns compared.
        clean: rows after one clean delivery of each event.
        faulty: rows after the run with faults.
        missing: up to three rows only the clean run left.
        extra: up to three rows only the faulty run left.
    """

    table: str
    columns: tuple[str, ...]
    clean: int
    faulty: int
    missing: tuple[Row, ...] = ()
    extra: tuple[Row, ...] = ()

    def __str__(self) -> str:
        if self.clean != self.faulty:
            head = (
                f"table {self.table}: {self.faulty} row(s), where one clean delivery of each "
                f"event leaves {self.clean}"
            )
        else:
            head = f"table {self.table}: the same {self.clean} row(s) count, different contents"
        lines = [head]
        lines += [f"  only after the faults: {self._show(row)}" for row in self.extra]
        lines += [f"  only after the clean delivery: {self._show(row)}" for row in self.missing]
        return "\n".join(lines)

    def _show(self, row: Row) -> str:
        return "(" + ", ".join(f"{c}={v!r}" for c, v in zip(self.columns, row, strict=True)) + ")"


def catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, Table]:
    """The ordinary and partitioned tables of ``schema`` (partitions are read through their parent).

    kinbox's own tables are left out (see :data:`SKIPPED`, :data:`INBOX_TABLE`).
    """
    columns = conn.execute(
        "SELECT c.relname, a.attname,"
        # identity, serial, or any default drawing from a sequence
        "       a.attidentity <> '' OR coalesce(pg_get_expr(d.adbin, d.adrelid), '')"
        "           LIKE '%%nextval(%%'"
        " FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
        " ORDER BY c.relname, a.attnum",
        (schema,),
    ).fetchall()
    found: dict[str, list[str]] = {}
    sequenced: dict[tuple[str, str], str] = {}
    for table, column, from_sequence in columns:
        found.setdefault(table, []).append(column)
        if from_sequence:
            sequenced[(table, column)] = "filled from a sequence"
    _follow_foreign_keys(conn, schema, sequenced)
    return {
        name: Table(name, tuple(cols), {c: why for (t, c), why in sequenced.items() if t == name})
        for name, cols in found.items()
        if name not in SKIPPED and name != INBOX_TABLE
    }


def _follow_foreign_keys(
    conn: psycopg.Connection[Any], schema: str, sequenced: dict[tuple[str, str], str]
) -> None:
    """Add to ``sequenced`` every column that refers, through foreign keys, to one in it."""
    links = conn.execute(
        "SELECT src.relname, sa.attname, dst.relname, da.attname"
        " FROM pg_constraint k"
        " JOIN pg_class src ON src.oid = k.conrelid"
        " JOIN pg_class dst ON dst.oid = k.confrelid"
        " JOIN pg_namespace n ON n.oid = src.relnamespace"
        " CROSS JOIN LATERAL unnest(k.conkey, k.confkey) AS pair(sk, dk)"
        " JOIN pg_attribute sa ON sa.attrelid = k.conrelid AND sa.attnum = pair.sk"
        " JOIN pg_attribute da ON da.attrelid = k.confrelid AND da.attnum = pair.dk"
        " WHERE k.contype = 'f' AND n.nspname = %s",
        (schema,),
    ).fetchall()
    grew = True
    while grew:  # a chain of references: follow it to its end
        grew = False
        for table, column, target, target_column in links:
            if (target, target_column) in sequenced and (table, column) not in sequenced:
                sequenced[(table, column)] = f"refers to {target}.{target_column}, from a sequence"
                grew = True


def take(conn: psycopg.Connection[Any], schema: str, tables: Mapping[str, Table]) -> Snapshot:
    """Read every row of ``tables`` and the inbox's ``(event_id, status)`` pairs."""
    space = sql.Identifier(schema)
    rows: dict[str, Counter[Row]] = {}
    for table in tables.values():
        if not table.columns:
            rows[table.name] = Counter()
            continue
        # Every value as text: any type compares, and the report can show it.
        select = sql.SQL("SELECT {} FROM {}.{}").format(
            sql.SQL(", ").join(
                sql.SQL("{}::text").format(sql.Identifier(c)) for c in table.columns
            ),
            space,
            sql.Identifier(table.name),
        )
        rows[table.name] = Counter(tuple(row) for row in conn.execute(select))
    inbox = sql.SQL("SELECT event_id, status FROM {}.{}").format(space, sql.Identifier(INBOX_TABLE))
    return Snapshot(rows, Counter((str(i), str(s)) for i, s in conn.execute(inbox)))


def volatile(
    first: Snapshot, second: Snapshot, tables: Mapping[str, Table]
) -> dict[str, dict[str, str]]:
    """The columns to leave out, by table, with why: sequenced, or unlike in two clean runs.

    Raises:
        ConfigurationError: a table holds a different number of rows after the
            two clean runs, so nothing about it can be compared.
    """
    ignored: dict[str, dict[str, str]] = {}
    for table in tables.values():
        a, b = first.rows[table.name], second.rows[table.name]
        if a.total() != b.total():
            raise ConfigurationError(
                f"two clean deliveries of the same events leave table {table.name} with "
                f"{a.total()} and {b.total()} rows: what the handler writes there does not "
                "follow from the events alone, so a run with faults cannot be compared with it"
            )
        why = dict(table.sequenced)
        for index, column in enumerate(table.columns):
            if column not in why and _column(a, index) != _column(b, index):
                why[column] = "differs between two clean runs"
        if why:
            ignored[table.name] = why
    return ignored


def compare(
    clean: Snapshot,
    faulty: Snapshot,
    tables: Mapping[str, Table],
    ignored: Mapping[str, Mapping[str, str]],
) -> list[TableDifference]:
    """What differs between ``clean`` and ``faulty``, leaving out the ``ignored`` columns."""
    differences = []
    for table in tables.values():
        skip = ignored.get(table.name, {})
        keep = [i for i, c in enumerate(table.columns) if c not in skip]
        names = tuple(table.columns[i] for i in keep)
        a = _project(clean.rows[table.name], keep)
        b = _project(faulty.rows[table.name], keep)
        if a != b:
            differences.append(_difference(table.name, names, a, b))
    if clean.inbox != faulty.inbox:
        differences.append(
            _difference(
                f"{INBOX_TABLE} (kinbox)", ("event_id", "status"), clean.inbox, faulty.inbox
            )
        )
    return differences


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """The tables whose rows differ between ``before`` and ``after``."""
    return sorted(name for name, rows in after.rows.items() if before.rows.get(name) != rows)


def _column(rows: Counter[Row], index: int) -> Counter[str | None]:
    values: Counter[str | None] = Counter()
    for row, count in rows.items():
        values[row[index]] += count
    return values


def _project(rows: Counter[Any], keep: Sequence[int]) -> Counter[Row]:
    out: Counter[Row] = Counter()
    for row, count in rows.items():
        out[tuple(row[i] for i in keep)] += count
    return out


def _difference(
    table: str, columns: tuple[str, ...], clean: Counter[Any], faulty: Counter[Any]
) -> TableDifference:
    missing = tuple(list((clean - faulty).elements())[:3])
    extra = tuple(list((faulty - clean).elements())[:3])
    return TableDifference(table, columns, clean.total(), faulty.total(), missing, extra)
