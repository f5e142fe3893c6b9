"""Scenario 14: a static member fenced by another with the same ``group.instance.id``.

librdkafka treats the fencing as a *fatal* consumer error: that consumer can
never poll or commit again. The fenced worker must say why and exit with its
own status (7) instead of idling; the member that took its place carries on,
and nothing is lost or applied twice across the hand-over (the fenced
member's batch in flight included: its offsets are never committed, so the
new member re-reads and the inbox suppresses what was already applied).
"""

from __future__ import annotations

from kinbox.cli.support import EXIT_FATAL
from tests.support.fault_run import Run
from tests.support.scenario import scenario

FENCED = "Static consumer fenced by other consumer with same group.instance.id"


@scenario("14", "fenced static member", fault="same group.instance.id twice")
def test_fenced_static_member_exits_and_its_successor_drains(run: Run) -> None:
    produced = run.produce(duplicates=run.rng.randint(0, 10))
    static = {"group.instance.id": f"{run.group}-member"}
    # A slow handler, so the fencing lands mid-stream with a batch in flight
    env = {"FAULT_SLEEP": str(run.rng.choice([0.005, 0.01, 0.02]))}
    batch = run.rng.choice([5, 20, 50])
    after = run.rng.randint(10, len(produced.records) // 3)
    with run.sampling():
        # Given a static member working through the stream
        first = run.factory.start("first", env=env, kafka=static, batch_max_messages=batch)
        run.wait_handler_calls(after)
        # When a second worker joins with the same group.instance.id
        second = run.factory.start("second", env=env, kafka=static, batch_max_messages=batch)
        # Then the first is fenced: it exits 7 and says why
        status = first.wait(60)
        assert status == EXIT_FATAL, first.log_tail()
        log = first.log()
        assert FENCED in log, first.log_tail()
        assert "the Kafka client failed fatally" in log, first.log_tail()
        # and the second, now the member, catches up alone
        run.wait_caught_up(second)
        assert second.stop() == 0, second.log_tail()
        assert "failed fatally" not in second.log(), second.log_tail()
    run.finish()
