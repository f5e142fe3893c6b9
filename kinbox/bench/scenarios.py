"""The scenarios: what each one does to the contenders, and which contenders it applies to.

========== ===================================================================
clean      N unique events, a backlog consumed by one member.
retries10  10% of the events sent again by the producer with the same id,
           half inside one batch, half in a later batch.
retries50  the same with 50%.
redelivery one member SIGKILLed between its database commit and its offset
           commit (kinbox's ``after_db_commit`` failpoint, the same point in
           the others) and restarted, repeatedly: its last batch comes back.
           Members are static (``group.instance.id``), so a restart takes the
           partitions back at once instead of waiting out a session timeout.
replay     the group consumes everything, its offsets are reset to the
           beginning, and it consumes everything again: 100% duplicates.
storm      members join and leave during the run (1 → 2 → 3 → 2 → 1,
           from 20% of the records on, each change as soon as the one
           before has taken effect; leaving is a clean SIGTERM), on 4x the
           events so the run outlasts the changes. A run whose topic was
           done first is checked but gives no figure (the report says so).
large      ``processed_events`` holds millions of rows of the group before the
           run (claims land in a big index); each run follows the same run
           on an empty table (reported as ``empty``), so the two differ in
           the table alone.
latency    measured from outside, as a team deploys and watches it
           (:mod:`kinbox.bench.outside`): ``kinbox worker`` from its command
           line with its defaults, fed by a producer process of its own at
           fixed rates for minutes; produce → effect committed over the run
           and per 10-second window, the worker's CPU time per event, and
           where the time goes stage by stage. The hand-written streaming
           inbox is measured the same way beside it.
drain      a backlog waiting in the topic, drained by ``kinbox worker`` (and
           the hand-written streaming inbox, set-based and with one INSERT
           per event) started from outside.
memory     a backlog of 1 KB events: peak RSS of the consumer process.
outbox     the outbox relay: a backlog's throughput, and commit → consumer
           latency woken by LISTEN/NOTIFY and by polling only; then the same
           table published by Debezium (CDC) through Kafka Connect, when the
           target has a Connect URL.
slow-keys  handlers that wait on the database: 10,000 records in ONE
           partition over 1,000 keys, each handler running
           ``SELECT pg_sleep(0.005)`` and its effect INSERT in its
           transaction. kinbox in partition order, kinbox in key order
           (``ordering="key"``, 16 keys at once) and Confluent's
           parallel-consumer 0.5.3.2 in KEY order (``maxConcurrency`` 16,
           a JDBC connection each, at-least-once); rate and CPU per event
           (:mod:`kinbox.bench.slowkeys`).
========== ===================================================================

Which contenders: every one but the streaming hand-written inboxes runs the
consumer scenarios, except that the inbox-off contender has no claim to
slow down in ``large``; ``latency`` and ``drain`` set kinbox's per-event and
batch handlers beside the streaming hand-written inbox (what a team would
deploy instead), and ``drain`` also beside its per-event twin; ``memory``
compares kinbox with the ceiling only (the slow contenders would take
minutes); ``outbox`` is the relay's and Debezium's —
none of the consumers has one; ``slow-keys`` has contenders of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinbox.bench.contenders import CONTENDERS, HAND, HAND_EACH, SLOW

AWAITED = ("kinbox-each-async", "kinbox-batch-async")
"""kinbox's ``async def`` handlers: run in the clean scenario only, beside their sync twins."""

ALL = tuple(
    c.name
    for c in CONTENDERS
    if c.name not in (HAND, HAND_EACH) and c.name not in AWAITED and c.name not in SLOW
)
"""The contenders of the scenarios run inside the harness."""

OUTSIDE = ("kinbox-each", "kinbox-batch", HAND)
"""The contenders of the outside scenarios: kinbox as deployed, beside the hand-written inbox."""

OUTBOX_CONTENDERS = ("relay", "debezium")
"""What publishes the outbox scenario's rows: ``kinbox outbox relay``, and Debezium (CDC)."""


@dataclass(frozen=True)
class Scenario:
    """One scenario: its name, what it does, and its contenders."""

    name: str
    title: str
    kind: str
    """Which procedure runs it (see :mod:`kinbox.bench.runs`)."""
    contenders: tuple[str, ...] = ALL
    duplicates: float = 0.0
    """Producer duplicates, as a share of the unique events."""
    pad: int = 0
    """Payload padding in bytes."""
    events: float = 1.0
    """Events per run, as a multiple of the sizes' (a storm must outlast its changes)."""
    repeat: int | None = None
    """At most this many runs per contender (fewer if the sizes' ``repeat`` says so)."""

    def repeats(self, wanted: int) -> int:
        """Runs per contender when the sizes ask for ``wanted``."""
        return min(wanted, self.repeat) if self.repeat else wanted


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("clean", "clean stream", "steady", contenders=ALL + AWAITED),
    Scenario("retries10", "producer retries 10%", "steady", duplicates=0.10),
    Scenario("retries50", "producer retries 50%", "steady", duplicates=0.50),
    Scenario(
        "redelivery", "consumer killed after DB commit, restarted", "redelivery"
    ),
    Scenario("replay", "full replay (100% duplicates)", "replay"),
    Scenario("storm", "rebalance storm (members join and leave)", "storm", events=4.0),
    Scenario(
        "large", "large processed_events", "large",
        contenders=tuple(n for n in ALL if n != "inbox-off"),
    ),
    Scenario(
        "latency", "latency at offered load, from outside", "latency", contenders=OUTSIDE,
        repeat=1,
    ),
    Scenario(
        "drain", "a backlog drained, from outside", "drain", contenders=(*OUTSIDE, HAND_EACH)
    ),
    Scenario(
        "memory", "backlog of 1 KB events (peak RSS)", "steady",
        contenders=("kinbox-each", "kinbox-batch", "ceiling"), pad=1000, repeat=1,
    ),
    Scenario(
        "outbox", "outbox: relay and Debezium (CDC)", "outbox",
        contenders=OUTBOX_CONTENDERS, repeat=1,
    ),
    Scenario(
        "slow-keys", "5 ms handlers, 1 partition, many keys", "slowkeys", contenders=SLOW,
        repeat=1,
    ),
)  # fmt: skip
"""Every scenario, in report order."""

BY_NAME = {s.name: s for s in SCENARIOS}

EMPTY = "empty"
"""Results of the large scenario's control runs, on an empty ``processed_events``."""

TITLES: dict[str, str] = {}
for _s in SCENARIOS:
    if _s.name == "large":
        TITLES[EMPTY] = "empty processed_events (control)"
    TITLES[_s.name] = _s.title
"""What the report calls each scenario whose results it shows."""


def title(name: str) -> str:
    """What the report calls the results named ``name`` (a latency run's offer spelled out)."""
    if name.startswith("latency-"):
        rate, _, producer = name.removeprefix("latency-").partition("-")
        return f"latency at {int(rate):,}/s, {producer} producer, from outside"
    return TITLES.get(name, name)
