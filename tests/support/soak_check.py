"""The soak's checker: what the topics hold, against the effects, the verdicts and the offsets.

After the final drain, :func:`check` copies every record of the soak's topics
and of their dead-letter topics, and every acknowledgement in the producer's
log, into tables of the round's schema (``COPY``: a soak of hours is checked
in flat memory), and asks PostgreSQL:

lost
    an event on a topic with no effect row and not recorded ``dead_lettered``;
applied twice
    an event with more than one effect row;
per-key order
    per topic and key, the events' first effects in order of application
    (``soak_effects.seq``) must follow the order of their first records on
    the topic (one key, one partition, so offset order: docs/design.md invariant 3);
wrong verdict
    an event the handler always refuses (:data:`~tests.support.soak_producer.DEAD`)
    applied, or another one dead-lettered;
dead letters
    each ``dead_lettered`` row has a record on the dead-letter topic, every
    dead letter's event is ``dead_lettered``, and the copies of one dead letter
    (at-least-once) all come from the same original record;
acknowledged, not on the topic
    the broker acknowledged a record the topic does not hold where it said;
lag
    every partition's committed offset equals its log end offset.

The topic is the truth for what was produced: an id the producer sent without
a delivery report (killed meanwhile, a *maybe*) counts if the topic holds it.
:mod:`tests.support.soak_report` turns the result into the failure report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.support.invariants import Outcome
from tests.support.records import Read, committed, dead_letter_id, iter_topic, log_ends
from tests.support.soak_logs import LOG_CHECKS, grep
from tests.support.soak_producer import DEAD

EXAMPLES = 10
"""Examples printed per failed check."""

_TABLES = """
CREATE TABLE {s}.soak_topic (topic text, partition int, "offset" bigint, event_id text,
                             n bigint, key text, kind text);
CREATE TABLE {s}.soak_dlq (topic text, partition int, "offset" bigint, event_id text,
                           origin text, reason text);
CREATE TABLE {s}.soak_acked (n bigint, topic text, partition int, "offset" bigint);
"""

_VERDICTS = """
CREATE TABLE {s}.soak_verdicts AS
SELECT t.*, coalesce(e.rows, 0) AS effects, p.status, p.reason
FROM (SELECT event_id, min(topic) AS topic, min(partition) AS partition,
             min("offset") AS first_offset, min(kind) AS kind, min(key) AS key,
             count(*) AS copies
      FROM {s}.soak_topic GROUP BY event_id) t
LEFT JOIN (SELECT event_id, count(*) AS rows FROM {s}.soak_effects GROUP BY event_id) e
       USING (event_id)
LEFT JOIN {s}.processed_events p ON p.consumer = %(group)s AND p.event_id = t.event_id;
"""

_WHERE = "topic || '[' || partition || ']@' || first_offset"
CHECKS: dict[str, str] = {
    "lost": f"""SELECT event_id, kind, {_WHERE}, coalesce(status, 'no processed_events row')
        FROM {{s}}.soak_verdicts WHERE effects = 0 AND status IS DISTINCT FROM 'dead_lettered'
        ORDER BY topic, partition, first_offset""",
    "applied twice": """SELECT v.event_id, v.kind, v.effects,
            string_agg(e.seq || ' by pid ' || e.pid, ', ' ORDER BY e.seq)
        FROM {s}.soak_verdicts v JOIN {s}.soak_effects e USING (event_id)
        WHERE v.effects > 1 GROUP BY v.event_id, v.kind, v.effects ORDER BY v.event_id""",
    "per-key order": """WITH firsts AS (SELECT event_id, min(seq) AS seq FROM {s}.soak_effects
                                        GROUP BY event_id),
        ordered AS (SELECT v.topic, v.key, v.event_id, v.first_offset, f.seq,
                           lag(v.event_id) OVER w AS before, lag(v.first_offset) OVER w AS at
                    FROM firsts f JOIN {s}.soak_verdicts v USING (event_id)
                    WINDOW w AS (PARTITION BY v.topic, v.key ORDER BY f.seq))
        SELECT topic || ' key ' || key, event_id || ' (offset ' || first_offset || ')',
               'applied after', before || ' (offset ' || at || ')'
        FROM ordered WHERE first_offset < at ORDER BY topic, key, seq""",
    "dead-lettered, should apply": f"""SELECT event_id, kind, {_WHERE}, reason
        FROM {{s}}.soak_verdicts WHERE status = 'dead_lettered' AND NOT kind = ANY(%(dead)s)""",
    "applied, should be dead-lettered": f"""SELECT event_id, kind, {_WHERE}, status
        FROM {{s}}.soak_verdicts WHERE effects > 0 AND kind = ANY(%(dead)s)""",
    "dead_lettered without a dead letter": f"""SELECT event_id, kind, {_WHERE}, reason
        FROM {{s}}.soak_verdicts v WHERE status = 'dead_lettered'
        AND NOT EXISTS (SELECT 1 FROM {{s}}.soak_dlq d WHERE d.event_id = v.event_id)""",
    "dead letter of an event not dead_lettered": """SELECT d.event_id, d.topic || '@' ||
            d."offset", d.reason, coalesce(v.status, 'no processed_events row')
        FROM {s}.soak_dlq d LEFT JOIN {s}.soak_verdicts v USING (event_id)
        WHERE v.status IS DISTINCT FROM 'dead_lettered'""",
    "dead letter copies of different records": """SELECT event_id,
            string_agg(DISTINCT origin, ', ') FROM {s}.soak_dlq GROUP BY event_id
        HAVING count(DISTINCT origin) > 1""",
    "acknowledged, not on the topic": """SELECT a.n, a.topic || '[' || a.partition || ']@' ||
            a."offset", coalesce(t.event_id, 'nothing there')
        FROM {s}.soak_acked a LEFT JOIN {s}.soak_topic t
          ON t.topic = a.topic AND t.partition = a.partition AND t."offset" = a."offset"
        WHERE t.n IS DISTINCT FROM a.n""",
}
"""Each check's query: every row it returns is one failure, printed as an example."""


@dataclass
class Result:
    """What the checker found: figures, and per check its failures (count and examples)."""

    figures: dict[str, int] = field(default_factory=dict)
    failures: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    """Check name -> (failures, the first :data:`EXAMPLES` of them); every check is here."""
    lost_at: list[tuple[str, int]] = field(default_factory=list)
    """The partitions where events were lost, for the report's log excerpts."""
    outcome: Outcome | None = None

    def add(self, name: str, rows: list[str], count: int | None = None) -> None:
        """Record check ``name``'s failures: ``rows``, one line each (``count``: if more)."""
        self.failures[name] = (len(rows) if count is None else count, rows[:EXAMPLES])

    @property
    def failed(self) -> list[str]:
        """The checks that failed."""
        return [name for name, (count, _) in self.failures.items() if count]


def _body(value: bytes | None) -> dict[str, Any]:
    try:
        body = json.loads(value or b"")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _load(db: psycopg.Connection[Any], s: sql.Identifier, bootstrap: str, topics: list[str],
          producer_log: Path) -> list[Read]:  # fmt: skip
    """Copy the topics, the dead-letter topics and the acknowledgements; return the dead letters."""
    db.execute(sql.SQL(_TABLES).format(s=s))
    letters: list[Read] = []
    with db.cursor() as cur:
        columns = '(topic, partition, "offset", event_id, n, key, kind)'
        with cur.copy(sql.SQL(f"COPY {{}}.soak_topic {columns} FROM STDIN").format(s)) as copy:
            for topic in topics:
                for r in iter_topic(bootstrap, topic):
                    body = _body(r.value)
                    copy.write_row((topic, r.partition, r.offset, r.header("event-id"),
                                    body.get("n"), body.get("key"), body.get("kind")))  # fmt: skip
        with cur.copy(sql.SQL("COPY {}.soak_dlq FROM STDIN").format(s)) as copy:
            for topic in topics:
                for r in iter_topic(bootstrap, f"{topic}.dlq"):
                    letters.append(r)
                    origin = "/".join(r.header(f"kinbox.dlq.{h}") or "?"
                                      for h in ("topic", "partition", "offset"))  # fmt: skip
                    copy.write_row((f"{topic}.dlq", r.partition, r.offset, dead_letter_id(r),
                                    origin, r.header("kinbox.dlq.reason")))  # fmt: skip
        with cur.copy(sql.SQL("COPY {}.soak_acked FROM STDIN").format(s)) as copy:
            for n, topic, partition, offset in _acks(producer_log, topics):
                copy.write_row((n, topic, partition, offset))
    db.execute(sql.SQL('CREATE INDEX ON {}.soak_topic (topic, partition, "offset")').format(s))
    return letters


def _acks(path: Path, topics: list[str]) -> Iterator[tuple[int, str, int, int]]:
    with path.open() as lines:
        for line in lines:
            parts = line.split()
            if parts[:1] == ["k"] and len(parts) == 5:
                yield int(parts[1]), topics[int(parts[2])], int(parts[3]), int(parts[4])


def producer_figures(path: Path) -> dict[str, int]:
    """Counts from the producer's log: acknowledged, failed, maybes, repeats, instances."""
    words = {"k": "acknowledged", "f": "delivery failed", "m": "maybes (sent again)",
             "r": "repeats sent", "start": "producer instances"}  # fmt: skip
    figures = dict.fromkeys(words.values(), 0)
    with path.open() as lines:
        for line in lines:
            word = line.split(" ", 1)[0]
            if word in words:
                figures[words[word]] += 1
    return figures


def batch_figures(log_dir: Path) -> tuple[int, int, int]:
    """From the workers' batch logs: records delivered, applied, duplicates suppressed."""
    delivered = applied = duplicates = 0
    for path in log_dir.glob("batches-*.log"):
        with path.open() as lines:
            for line in lines:
                parts = line.split()
                if parts[:1] == ["d"] and len(parts) == 2:
                    delivered += int(parts[1])
                elif parts[:1] == ["r"] and len(parts) == 3:
                    applied += int(parts[1])
                    duplicates += int(parts[2])
    return delivered, applied, duplicates


_FIGURES = """SELECT (SELECT count(*) FROM {s}.soak_topic), count(*),
    count(*) FILTER (WHERE effects = 1), count(*) FILTER (WHERE status = 'dead_lettered'),
    count(*) FILTER (WHERE kind = ANY(%(dead)s)), count(*) FILTER (WHERE copies > 1)
    FROM {s}.soak_verdicts"""


_LOST = "FROM {s}.soak_verdicts WHERE effects = 0 AND status IS DISTINCT FROM 'dead_lettered'"
_TWICE = "FROM {s}.soak_verdicts WHERE effects > 1"
_DEAD = "FROM {s}.soak_verdicts WHERE status = 'dead_lettered'"


def _rows(db: psycopg.Connection[Any], s: sql.Identifier, query: str) -> list[tuple[Any, ...]]:
    return db.execute(sql.SQL(query).format(s=s)).fetchall()


def _column(db: psycopg.Connection[Any], s: sql.Identifier, query: str) -> list[Any]:
    return [row[0] for row in _rows(db, s, query)]


def check(bootstrap: str, database_url: str, schema: str, group: str, topics: list[str],
          partitions: int, producer_log: Path, log_dir: Path) -> Result:  # fmt: skip
    """Run every check of the module docstring (the lag last); never raises for a finding."""
    s = sql.Identifier(schema)
    result = Result()
    params = {"dead": sorted(DEAD)}
    with psycopg.connect(database_url, autocommit=True) as db:
        letters = _load(db, s, bootstrap, topics, producer_log)
        db.execute(sql.SQL(_VERDICTS).format(s=s), {"group": group})
        for name, query in CHECKS.items():
            rows = db.execute(sql.SQL(query).format(s=s), params).fetchall()
            result.add(name, [" ".join(str(v) for v in row) for row in rows])
        row = db.execute(sql.SQL(_FIGURES).format(s=s), params).fetchone()
        assert row is not None
        records, events, once, dead_lettered, refused, repeated = (int(v) for v in row)
        lost = _column(db, s, f"SELECT event_id {_LOST}")
        lost_at = _rows(db, s, f"SELECT DISTINCT topic, partition {_LOST} LIMIT 3")
        result.lost_at = sorted((str(t), int(p)) for t, p in lost_at)
        twice = {str(i): int(n) for i, n in _rows(db, s, f"SELECT event_id, effects {_TWICE}")}
        dead = _column(db, s, f"SELECT event_id {_DEAD}")
    delivered, _, duplicates = batch_figures(log_dir)
    result.figures = {
        "records on the topics": records, "distinct events": events,
        "events on the topics more than once": repeated, "applied once": once,
        "dead-lettered": dead_lettered, "meant to be dead-lettered": refused,
        "dead letters on the dead-letter topics": len(letters),
        "records handed to batches": delivered, "duplicates suppressed": duplicates,
        **producer_figures(producer_log),
    }  # fmt: skip
    for name, pattern in LOG_CHECKS.items():
        result.add(name, grep(log_dir, pattern))
    offsets, behind = _lag(bootstrap, group, topics, partitions)
    result.add("lag at the end", behind)
    result.outcome = Outcome(
        produced=records, events=events, deliveries=delivered, applied_once=once,
        duplicates_suppressed=duplicates, dead_lettered=dead_lettered, lost=lost,
        applied_twice=twice, offsets=offsets,
        dead_letters=letters, dead_ids=frozenset(dead),
    )  # fmt: skip
    return result


def positions(bootstrap: str, group: str, topics: list[str], partitions: int
              ) -> dict[tuple[str, int], tuple[int | None, int]]:  # fmt: skip
    """Every partition's committed offset (``None``: none yet) and log end offset."""
    found: dict[tuple[str, int], tuple[int | None, int]] = {}
    for topic in topics:
        got = committed(bootstrap, group, topic, partitions)
        for partition, end in log_ends(bootstrap, topic, partitions).items():
            found[(topic, partition)] = (got.get(partition), end)
    return found


def lag(bootstrap: str, group: str, topics: list[str], partitions: int) -> int:
    """Records the group has yet to commit, all partitions together."""
    return sum(end - (at or 0) for at, end in positions(bootstrap, group, topics, partitions)
               .values())  # fmt: skip


def _lag(bootstrap: str, group: str, topics: list[str], partitions: int
         ) -> tuple[dict[int, int], list[str]]:  # fmt: skip
    """The first topic's committed offsets, and every partition not committed to its end."""
    found = positions(bootstrap, group, topics, partitions)
    first = {p: at for (t, p), (at, _) in found.items() if t == topics[0] and at is not None}
    behind = [f"{t}[{p}] committed {at} of {end}" for (t, p), (at, end) in found.items()
              if (at or 0) != end]  # fmt: skip
    return first, behind
