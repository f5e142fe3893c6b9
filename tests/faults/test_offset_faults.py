"""Scenarios 22-23: an operator moves the group's offsets while it is stopped.

22 (three cases): the group applied every event and stopped; then its
offsets are reset to the earliest (``earliest``), the group is deleted with
its offsets (``deleted``), or they are set past the end of the log
(``past-end``). An offset past the end is out of range: the consumer applies
``auto.offset.reset``, which kinbox sets to ``earliest``. So every case
re-reads the partitions from their start: zero new effects, every old record
delivered again and suppressed, and the events published meanwhile applied
once — nothing skipped. (Until the worker is back, offsets set past the end
claim events published meanwhile that no one applied: the operator's doing.)

23: ``kinbox inbox cleanup`` removed the rows older than its window (rows
aged on purpose: some past the window, some inside it), then the offsets are
reset to the earliest — a redelivery past the retention. Exactly the events
whose rows were removed are applied a second time; the others are
suppressed.
"""

from __future__ import annotations

import contextlib

import psycopg
from click.testing import CliRunner
from psycopg import sql

from kinbox.cli.main import main
from tests.support.fault_run import Run
from tests.support.group_moves import (
    apply_all,
    delete_group,
    move_offsets,
    publish_more,
    set_offsets,
)
from tests.support.invariants import check_invariants, effect_counts, offsets_behind_database
from tests.support.records import committed
from tests.support.scenario import scenario
from tests.support.waiting import wait_for
from tests.support.workers import drain, read_deliveries


@scenario(
    "22", "offsets moved: {case}", fault="group stopped, offsets {case}",
    cases={case: {"move": case} for case in ("earliest", "deleted", "past-end")},
)  # fmt: skip
def test_offsets_moved_under_a_stopped_group_apply_nothing_twice(run: Run, move: str) -> None:
    first = run.produce(duplicates=run.rng.randint(0, 10))
    # Given a group that applied every event, and stopped
    apply_all(run)
    # When an operator moves its offsets
    ends = first.end_offsets()
    if move == "earliest":
        move_offsets(run, set_offsets(run, dict.fromkeys(ends, 0)))
    elif move == "deleted":
        move_offsets(run, delete_group(run))
    else:
        move_offsets(run, set_offsets(run, {p: e + 1000 for p, e in ends.items()}))
    # and more events are published before the group comes back
    both = publish_more(run, first, run.rng.randint(20, 60), "later")
    # (Set past the end, the group's offsets claim the events published meanwhile
    # until the worker is back and resets them: the operator's doing, so invariant
    # 2 is checked only at the end there.)
    with run.sampling() if move != "past-end" else contextlib.nullcontext():
        worker = run.factory.start("after-move")
        worker.wait_assigned()
        # (exactly at the end: offsets set past it already compare as caught up)
        wait_for(
            lambda: committed(run.bootstrap, run.group, run.topic, run.partitions)
            == both.end_offsets(),
            60, "the group's offsets back at the end of the log",
        )  # fmt: skip
        assert worker.stop() == 0, worker.log_tail()
    # Then every old record was read again and suppressed, and the new ones applied once
    delivered = read_deliveries(run.log_dir).records
    again = [where for where in first.records if delivered[where] < 2]
    assert not again, f"{len(again)} old records not re-read (skipped?): {again[:5]}"
    outcome = run.finish()
    assert outcome.duplicates_suppressed >= len(first.records), outcome
    assert outcome.events == len(both.ids)


@scenario("23", "redelivery past inbox cleanup", fault="rows deleted, offsets reset")
def test_only_events_older_than_the_cleanup_window_apply_again(run: Run) -> None:
    produced = run.produce()
    apply_all(run)
    # Given processed_events rows of which some are older than the window, some inside it
    ids = sorted(produced.ids)
    run.rng.shuffle(ids)
    old = set(ids[: len(ids) // 3])
    with psycopg.connect(run.database_url, autocommit=True) as conn:
        age = sql.SQL(
            "UPDATE {}.processed_events SET processed_at = now() - %s::interval"
            " WHERE consumer = %s AND event_id = ANY(%s)"
        ).format(sql.Identifier(run.schema))
        conn.execute(age, ("15 days", run.group, sorted(old)))
        conn.execute(age, ("13 days", run.group, sorted(set(ids) - old)))
    # When the cleanup removes what is older than 14 days
    cleaned = CliRunner().invoke(
        main, ["inbox", "cleanup", "--older-than", "14d", "--batch-size", "37",
               "--database-url", run.database_url, "--schema", run.schema,
               "--bootstrap-servers", run.bootstrap],
    )  # fmt: skip
    assert cleaned.exit_code == 0, cleaned.output
    assert f"deleted {len(old)} processed_events row(s)" in cleaned.output, cleaned.output
    # and every record is delivered again (offsets reset: a replay past the retention)
    move_offsets(run, set_offsets(run, dict.fromkeys(produced.end_offsets(), 0)))
    with run.sampling() as sampler:
        drain(run.factory, produced, name="replay")
    assert not sampler.violations(), sampler.violations()[:5]
    # Then exactly the events whose rows were removed are applied a second time
    run.outcome = outcome = check_invariants(run.factory, produced)
    effects = effect_counts(run.database_url, run.schema)
    assert {i for i, n in effects.items() if n == 2} == old, "applied again: not the old ones"
    assert {i for i, n in effects.items() if n == 1} == set(ids) - old
    assert not outcome.lost and outcome.out_of_order == [], outcome
    assert outcome.offsets == produced.end_offsets()
    assert not offsets_behind_database(
        run.database_url, run.schema, run.bootstrap, run.group, produced
    )
