"""Scenarios 27a-27b: faults while a replay is skimmed.

After a whole batch of duplicates a partition is *skimmed*
(:mod:`kinbox.apply.skim`): its next records come as a run of up to four
batches whose ids are looked up first, outside any transaction; the known
ones are dropped, and what is left is applied batch by batch, each in its
own transaction, the run's offset committed only when the whole run ended.
Each round lets a group apply everything, stop, have its offsets reset to
the earliest, and get more events published meanwhile; so a replay of the
old events runs into fresh ones inside a skimmed run. Then:

27a. SIGKILL the worker at a COMMIT of a fresh batch inside such a run
     (just before it, or just after it with the run's offset not
     committed);
27b. start a second member while the first one holds a fresh batch of a
     skimmed run open on two partitions, so a rebalance revokes them with
     the run in flight, and release the held calls during the revoke.

Each ends with a final drain; the invariants are checked in the database
(every event applied once, in offset order per partition, every old record
delivered again and suppressed) and on the broker (committed offsets,
sampled throughout, never ahead of the database).
"""

from __future__ import annotations

import signal

from tests.support.fault_run import Run
from tests.support.group_moves import apply_all, move_offsets, publish_more, set_offsets
from tests.support.holds import held_env, holding, wait_holding
from tests.support.records import Produced
from tests.support.scenario import scenario
from tests.support.workers import read_deliveries

SKIMMING = "skimming its next records"
"""What the runner logs when a partition starts to skim."""

BATCH = 10
"""Records a batch: a run is four of them, and every partition's history many runs."""


def _replay_with_news(run: Run) -> tuple[Produced, Produced]:
    """A group that applied a history and stopped, reset to the earliest; then news."""
    history = run.produce(count=max(run.events, 600), duplicates=run.rng.randint(0, 10))
    apply_all(run)
    move_offsets(run, set_offsets(run, dict.fromkeys(history.end_offsets(), 0)))
    both = publish_more(run, history, run.rng.randint(60, 120), "news")
    return history, both


def _first_news(history: Produced, both: Produced, partitions: tuple[int, ...]) -> list[str]:
    """The id of the first record published after ``history`` on each of ``partitions``."""
    ends = history.end_offsets()
    return [both.records[(p, ends[p])] for p in partitions]


@scenario(
    "27a", "crash in a skimmed run {case}", fault="offsets reset, SIGKILL at {case} COMMIT",
    cases={
        "before": {"point": "before_db_commit"},
        "after": {"point": "after_db_commit"},
    },
)  # fmt: skip
def test_sigkill_at_a_commit_inside_a_skimmed_run(run: Run, point: str) -> None:
    history, _ = _replay_with_news(run)
    # Each partition's first batch is claimed (a transaction: its COMMIT passes
    # the failpoint) and is all duplicates; from then on the partition skims,
    # and only a fresh batch of a run opens a transaction.
    nth = run.partitions + run.rng.randint(1, run.partitions)
    with run.sampling():
        # Given a worker replaying the history, skimmed, into the news
        victim = run.factory.start(
            "victim", failpoints=f"{point}=kill@{nth}", batch_max_messages=BATCH
        )
        # When it is SIGKILLed at the COMMIT of a fresh batch of a run
        assert victim.wait(60) == -signal.SIGKILL, victim.log_tail()
    assert SKIMMING in victim.log(), victim.log_tail()
    # Then a clean worker ends with every event applied once, in order, and
    # every record of the history suppressed again
    outcome = run.finish()
    assert outcome.duplicates_suppressed >= len(history.records), outcome


@scenario("27b", "rebalance during a skimmed run", fault="join with a skimmed run held")
def test_rebalance_with_a_skimmed_run_in_flight(run: Run) -> None:
    history, both = _replay_with_news(run)
    held = _first_news(history, both, (1, 2))
    with run.sampling():
        # Given a member whose skimmed runs on partitions 1 and 2 reached the
        # news and hold the first fresh call open, inside the run's transaction
        # (not "first": apply_all's worker wrote first.log, and a log is its worker's name)
        first = run.factory.start(
            "skimmer", env=held_env(run, held, 0.01), batch_max_messages=BATCH
        )
        wait_holding(run, held, first.pid)
        assert SKIMMING in first.log(), first.log_tail()
        # When a second member joins, and the held calls end during the revoke
        joiner = run.factory.start("joiner", env=held_env(run, [], 0.01))
        first.wait_log(r"revoked \[\(")
        holding(run, held, first.pid)
        (run.log_dir / "gate").touch()
        # Then both members finish the stream
        run.wait_caught_up(first, joiner, timeout=60)
        assert first.stop() == 0, first.log_tail()
        assert joiner.stop() == 0, joiner.log_tail()
    # The revoke waited for the runs in flight and committed their offsets itself
    assert "will not be committed" not in first.log(), first.log_tail()
    holds = read_deliveries(run.log_dir).holds
    assert all(dict(holds[i]).keys() == {"begin", "end"} for i in held), holds
    outcome = run.finish()
    assert outcome.duplicates_suppressed >= len(history.records), outcome
