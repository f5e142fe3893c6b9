"""The redelivery check: a handler's effect must stay the same when its events come again.

:func:`assert_redelivery_safe` runs the events through the real inbox code
(:class:`~kinbox.testing.InboxTestClient`) several times, each run in a fresh
schema that ``setup`` fills in:

1. twice cleanly, one delivery of each event (two runs, to tell apart the
   columns that differ between any two runs: times, random ids);
2. once with every fault on every event: the worker killed between the
   handler and COMMIT, a transient database error after the handler ran,
   a COMMIT whose answer was lost, and each event delivered again later
   (twice in one batch, new offsets), see :data:`SCENARIOS`;

and compares every table of the schema after 2 with after 1 (the method is
in :mod:`kinbox.testing.snapshot`). Inside the inbox transaction all of that
is harmless: a rolled-back try leaves nothing, and a redelivery is a
duplicate. What it catches is an effect that escapes the transaction: a
write through a connection of the handler's own, a counter kept outside the
database (see ``observe``), anything the rollback cannot take back. Only
when the tables differ are the faults run again one scenario and one event
at a time, so the failure names the event, the fault and the table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg

from kinbox.app import App
from kinbox.core.errors import ConfigurationError
from kinbox.core.record import Position
from kinbox.testing.client import InboxTestClient
from kinbox.testing.messages import Message
from kinbox.testing.recorder import Fault
from kinbox.testing.report import (
    SCENARIOS,
    Difference,
    RedeliveryReport,
    RedeliveryUnsafe,
    Scenario,
    explain,
)
from kinbox.testing.snapshot import (
    Snapshot,
    Table,
    catalog,
    changed,
    compare,
    take,
    volatile,
)

Setup = Callable[[psycopg.Connection[Any]], object]


def assert_redelivery_safe(
    app: App,
    events: Iterable[Message],
    *,
    database_url: str,
    setup: Setup | None = None,
    scenarios: Sequence[Scenario] = SCENARIOS,
    observe: Callable[[], object] | None = None,
    reset: Callable[[], object] | None = None,
    group_id: str | None = None,
) -> RedeliveryReport:
    """Check that redelivering ``events``, with crashes and retries, changes nothing.

    Args:
        app: the handlers.
        events: what to deliver, in order (partition and offset as the test
            client places them).
        database_url: the PostgreSQL server; each run gets a schema of its
            own there, dropped afterwards.
        setup: creates what the handlers need, given an autocommit
            connection whose search path starts with the run's schema:
            create the tables without a schema name and they are the run's.
        scenarios: which faults to inject (:data:`SCENARIOS`).
        observe: for effects outside the database: returns their state
            (a counter, a list of sent mails), compared like a table after
            each run.
        reset: puts that outside state back, before each run.
        group_id: the consumer group (default: the app's).

    Returns:
        What was compared, when nothing differed.

    Raises:
        RedeliveryUnsafe: something ends differently than after one clean
            delivery of each event; the message names the event, the fault
            and the table (or ``observe()``).
        ConfigurationError: the check cannot judge: the handler writes
            tables outside the run's schema, or two clean runs already end
            differently in a table's row count or in ``observe()``.
    """
    check = _Check(app, list(events), database_url, setup, observe, reset, group_id)
    unknown = set(scenarios) - set(SCENARIOS)
    if not check.messages or unknown:
        raise ConfigurationError(
            f"assert_redelivery_safe needs events and scenarios among {SCENARIOS}, "
            f"got {len(check.messages)} event(s) and {sorted(unknown) or list(scenarios)}"
        )
    first, second = check.run(), check.run()
    check.judgeable(first, second)
    ignored = volatile(first.snapshot, second.snapshot, first.tables)
    every = range(len(check.messages))
    faulty = check.run(*_plan(scenarios, every))
    report = RedeliveryReport(
        len(check.messages),
        check.runs,
        faulty.injected,
        (*sorted(first.tables), "processed_events"),
        tuple(changed(first.before, first.snapshot)),
        ignored,
    )
    if not check.differences(first, faulty, ignored, None, None):
        return report
    found: list[Difference] = []
    for scenario in scenarios:
        alone = check.run(*_plan([scenario], every))
        if not check.differences(first, alone, ignored, scenario, None):
            continue
        one_by_one = [
            difference
            for index in every
            for difference in check.differences(
                first, check.run(*_plan([scenario], [index])), ignored, scenario, index
            )
        ]
        found += one_by_one or check.differences(first, alone, ignored, scenario, None)
    found = found or check.differences(first, faulty, ignored, None, None)
    raise RedeliveryUnsafe(explain(found, report, check.runs), found)


@dataclass(frozen=True)
class _Outcome:
    """The end of one run."""

    snapshot: Snapshot
    before: Snapshot
    tables: Mapping[str, Table]
    outside: frozenset[str]
    observed: object
    injected: int


class _Check:
    """Runs the events into fresh schemas and tells what differs."""

    def __init__(
        self,
        app: App,
        messages: list[Message],
        database_url: str,
        setup: Setup | None,
        observe: Callable[[], object] | None,
        reset: Callable[[], object] | None,
        group_id: str | None,
    ) -> None:
        self.app = app
        self.messages = messages
        self.database_url = database_url
        self.setup = setup
        self.observe = observe
        self.reset = reset
        self.group_id = group_id
        self.runs = 0
        self.partitions = 1 + max((m.partition or 0 for m in messages), default=0)
        # Where each message is first delivered: the test client places them
        # in order, each at the next offset of its partition.
        self.places: list[Position] = []
        counts: dict[tuple[str, int], int] = {}
        for message in messages:
            tp = (message.topic, message.partition_for(self.partitions))
            self.places.append((*tp, counts.get(tp, 0)))
            counts[tp] = counts.get(tp, 0) + 1

    def run(
        self, faults: Mapping[int, Sequence[Fault]] | None = None, duplicates: Sequence[int] = ()
    ) -> _Outcome:
        """Deliver every message once (``faults`` on some), then ``duplicates`` again."""
        self.runs += 1
        if self.reset is not None:
            self.reset()
        client = InboxTestClient(
            self.app, self.database_url, group_id=self.group_id, partitions=self.partitions
        )
        with client:
            with client.connect() as conn:
                if self.setup is not None:
                    self.setup(conn)
                tables = catalog(conn, client.schema)
                before = take(conn, client.schema, tables)
            outside: set[str] = set()
            client.store.watch = partial(_written_outside, outside, client.schema)
            client.store.faults = {self.places[i]: list(f) for i, f in (faults or {}).items()}
            for message in self.messages:
                client.deliver_message(message)
            if duplicates:
                again = [self.messages[i] for i in duplicates]
                client.deliver_batch([m for m in again for _ in range(2)])
            with client.connect() as conn:
                after = take(conn, client.schema, tables)
            observed = self.observe() if self.observe is not None else None
            return _Outcome(
                after, before, tables, frozenset(outside), observed, len(client.store.injected)
            )

    def judgeable(self, first: _Outcome, second: _Outcome) -> None:
        """Raise :class:`ConfigurationError` unless two clean runs can stand as the reference."""
        if first.outside:
            raise ConfigurationError(
                f"the handler writes {', '.join(sorted(first.outside))}, outside the run's schema, "
                "which the check cannot compare between runs: create those tables in setup= "
                "without a schema name (they then live in each run's own schema)"
            )
        if first.observed != second.observed:
            raise ConfigurationError(
                f"two clean deliveries of the same events give observe() = {first.observed!r} "
                f"and {second.observed!r}: pass reset= to put the outside state back before "
                "each run, or observe something that follows from the events alone"
            )

    def differences(
        self,
        clean: _Outcome,
        faulty: _Outcome,
        ignored: Mapping[str, Mapping[str, str]],
        scenario: Scenario | None,
        index: int | None,
    ) -> list[Difference]:
        """What ``faulty`` ends with that ``clean`` does not, blamed on ``scenario`` / ``index``."""
        message = None if index is None else self.messages[index]
        where = None if index is None else self.places[index]
        found = [
            Difference(scenario, message, where, table)
            for table in compare(clean.snapshot, faulty.snapshot, clean.tables, ignored)
        ]
        if clean.observed != faulty.observed:
            found.append(
                Difference(scenario, message, where, observed=(clean.observed, faulty.observed))
            )
        return found


def _plan(
    scenarios: Sequence[Scenario], indices: Iterable[int]
) -> tuple[dict[int, list[Fault]], list[int]]:
    """The faults per message and the messages to deliver again, for ``scenarios``."""
    chosen = list(indices)
    faults: list[Fault] = [s for s in scenarios if s != "duplicate"]
    duplicates = chosen if "duplicate" in scenarios else []
    return ({i: list(faults) for i in chosen} if faults else {}), duplicates


_WRITTEN_OUTSIDE = (
    "SELECT schemaname || '.' || relname FROM pg_stat_xact_user_tables"
    " WHERE n_tup_ins + n_tup_upd + n_tup_del > 0"
    " AND schemaname <> %s AND schemaname NOT LIKE 'pg\\_temp%%'"
)


def _written_outside(
    found: set[str], schema: str, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
) -> Awaitable[None] | None:
    """Add to ``found`` the tables this transaction has written so far outside ``schema``.

    ``pg_stat_xact_user_tables`` counts the current transaction's own row
    changes at once (``pg_stat_user_tables`` only after it ends, and late).
    On an ``AsyncConnection`` (an async handler's transaction), the awaitable
    that does it.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        return _written_outside_async(found, schema, conn)
    found.update(str(name) for (name,) in conn.execute(_WRITTEN_OUTSIDE, (schema,)).fetchall())
    return None


async def _written_outside_async(
    found: set[str], schema: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    rows = await (await conn.execute(_WRITTEN_OUTSIDE, (schema,))).fetchall()
    found.update(str(name) for (name,) in rows)
