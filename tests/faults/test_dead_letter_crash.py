"""Scenario 16: the worker dies after its dead letters were acknowledged, before its COMMIT.

Dead letters are at-least-once: a batch's dead letters must be acknowledged
by the broker *before* the transaction that records them commits (or the
offset could pass an event that is neither applied nor dead-lettered), so a
crash in between leaves them on the dead-letter topic while the database
forgets the whole batch. They are flushed with no transaction open, between
the transaction that found them (rolled back) and the one that records them,
so the worker dies either right after the acknowledgement (``after-ack``) or
inside that second transaction, just before its COMMIT (``before-commit``).
The restarted worker dead-letters the same events again. What must hold:
each such event is dead-lettered in the database exactly once and applied
never; the topic holds it once or twice, never zero, every copy naming the
same original record; and replaying all the copies applies the event once.
"""

from __future__ import annotations

import signal
from collections import Counter

from click.testing import CliRunner

from kinbox.cli.main import main
from tests.support.fault_run import Run
from tests.support.invariants import effect_counts, processed
from tests.support.records import Headers, Produced, dead_letter_id, read_topic
from tests.support.scenario import scenario
from tests.support.workers import drain


def _stream(run: Run, count: int, every: int, duplicates: int) -> frozenset[str]:
    """Produce ``count`` events, every ``every``-th poison, and return the poison ids.

    The first record of every partition is a poison event. The failpoint
    kills the worker at the first batch to get past its dead letters'
    acknowledgement (some partition's first: they all hold one), so they
    are flushed and acknowledged.
    """
    poison = [n for n in range(count) if n % every == 0]
    heads = poison[: run.partitions]
    order = heads + [n for n in range(count) if n not in heads]
    items: list[tuple[int, Headers, str | None]] = []
    for position, n in enumerate(order):
        event_id = f"{run.group}-ev-{n}"
        partition = position if position < run.partitions else n % run.partitions
        items.append((partition, [("event-id", event_id.encode())], event_id))
    for _ in range(duplicates):  # repeats later in the stream, never at a partition's head
        _, headers, repeated = items[run.rng.randrange(len(items))]
        at = run.rng.randrange(run.partitions, len(items) + 1)
        items.insert(at, (run.rng.randrange(run.partitions), headers, repeated))
    run.produce_plan(items)
    return frozenset(f"{run.group}-ev-{n}" for n in poison)


@scenario(
    "16", "crash between dead-letter flush and commit ({case})",
    fault="SIGKILL after DLQ ack, {case}",
    cases={
        "after-ack": {"point": "after_dead_letter_ack"},
        "before-commit": {"point": "before_db_commit"},
    },
)  # fmt: skip
def test_crash_between_dead_letter_flush_and_commit(run: Run, point: str) -> None:
    every = run.rng.choice([4, 5, 7])
    batch = run.rng.choice([5, 20, 50])
    poison = _stream(run, run.events, every, run.rng.randint(0, 10))
    run.expect_dead = poison
    run.dead_letter_copies = 2
    dlq = f"{run.topic}.dlq"
    # A handler that fails the poison events; each is given up on its first try
    env = {"FAULT_POISON_EVERY": str(every), "FAULT_SLEEP": "0.001"}
    args = ["--max-attempts", "1"]
    with run.sampling():
        # Given a worker that dies right after its first dead letters were acknowledged
        victim = run.factory.start(
            "victim", failpoints=f"{point}=kill@1", env=env, args=args,
            batch_max_messages=batch,
        )  # fmt: skip
        assert victim.wait(60) == -signal.SIGKILL, victim.log_tail()
        # (they are on the topic while the database has nothing of their batch)
        flushed = {dead_letter_id(letter) for letter in read_topic(run.bootstrap, dlq)}
        assert flushed and flushed <= poison, flushed
        assert not set(processed(run.database_url, run.schema, run.group)) & flushed
        # When the worker is restarted (the handler still failing them)
        restarted = run.factory.start("restarted", env=env, args=args, batch_max_messages=batch)
        run.wait_caught_up(restarted)
        assert restarted.stop() == 0, restarted.log_tail()
    # Then (checked by finish) each poison event is dead_lettered in the
    # database, applied never, and on the topic at most twice, every copy
    # with the same kinbox.dlq.topic/partition/offset; nothing lost or doubled
    outcome = run.finish()
    copies = Counter(dead_letter_id(letter) for letter in outcome.dead_letters)
    assert set(copies) == poison, sorted(poison - set(copies))
    assert all(copies[i] >= 2 for i in flushed), copies
    # (an id sent twice may also be given up once from each of its records)
    assert run.produced is not None
    repeated = {i for i, n in Counter(run.produced.records.values()).items() if n > 1}
    assert {i for i, n in copies.items() if n >= 2} <= flushed | repeated, copies
    _replay_applies_once(run, dlq, poison)


def _replay_applies_once(run: Run, dlq: str, poison: frozenset[str]) -> None:
    """Replaying every copy of the dead letters (the handler fixed) applies each event once."""
    result = CliRunner().invoke(
        main, ["dlq", "replay", "--topic", dlq, "--bootstrap-servers", run.bootstrap]
    )
    assert result.exit_code == 0, result.output
    everything = read_topic(run.bootstrap, run.topic)
    ids = {(r.partition, r.offset): r.header("event-id") or "?" for r in everything}
    drain(run.factory, Produced(run.topic, run.partitions, ids), name="after-replay")
    effects = effect_counts(run.database_url, run.schema)
    assert {i: effects[i] for i in poison} == dict.fromkeys(poison, 1)
    assert max(effects.values()) == 1, {i: n for i, n in effects.items() if n > 1}
    status = processed(run.database_url, run.schema, run.group)
    assert {status[i] for i in poison} == {"applied"}
