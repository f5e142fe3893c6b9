"""Scenarios 7-8: a batch still in flight when the group changes, or longer than max.poll.interval.

While a batch runs, kinbox pauses its partitions and keeps polling (the hold
path, see :mod:`kinbox.consume.runner`). These scenarios hold a handler on purpose
(``FAULT_SLOW_IDS`` in :mod:`tests.support.effect_app`) and check that the
member neither becomes a zombie nor loses or repeats an effect, and that each
partition's effects keep offset order across the hand-over.
"""

from __future__ import annotations

import re

from tests.support.fault_run import Run
from tests.support.invariants import effects_by_pid
from tests.support.launch import PROTOCOLS
from tests.support.scenario import scenario
from tests.support.workers import Worker, read_deliveries

HOLD = r"still running after [\d.]+s: pausing"
MAX_POLL = 6.0
"""max.poll.interval (and session timeout) of scenario 8's worker, in seconds."""


def _holds_ended(run: Run) -> int:
    """Held handler calls that have returned so far."""
    holds = read_deliveries(run.log_dir).holds.values()
    return sum(1 for calls in holds for kind, _ in calls if kind == "end")


def _join_mid_batch(run: Run, protocol: str) -> tuple[Worker, Worker]:
    """Hold the first member's batch, start a second member, release the batch mid-rebalance.

    The first event of every partition is held (until a gate file appears), so
    whichever partitions the first batch covers, it is held before anything
    else happened. The gate opens only once the rebalance has reached the
    first member (it logged a revoke) with its handler still held.
    """
    slow = [f"{run.group}-ev-{n}" for n in range(run.partitions)]
    gate = run.log_dir / "gate"
    env = {
        "FAULT_SLEEP": "0.003",
        "FAULT_SLOW_IDS": ",".join(slow),
        "FAULT_SLOW_SECONDS": "40",  # a safety net: the gate opens long before
        "FAULT_GATE": str(gate),
    }
    kafka = PROTOCOLS[protocol]
    # Given a member whose batch is held by a slow handler
    first = run.factory.start("slow-member", env=env, kafka=kafka)
    first.wait_log(HOLD)
    # When a second member joins while that batch is in flight
    joiner = run.factory.start("joiner", env=env, kafka=kafka)
    first.wait_log(r"revoked \[\(")
    assert not _holds_ended(run), "the batch ended before the rebalance reached it"
    gate.touch()
    return first, joiner


@scenario(
    "7", "rebalance in flight {case}", fault="member joins mid-batch, {case}", partitions=4,
    cases={
        **{protocol: {"protocol": protocol, "handler": "sync"} for protocol in PROTOCOLS},
        # The async handler, under kinbox's default assignment
        "cooperative-async": {"protocol": "cooperative", "handler": "async"},
    },
)  # fmt: skip
def test_member_joins_while_a_batch_is_in_flight(run: Run, protocol: str, handler: str) -> None:
    run.factory.handler = handler
    run.produce(duplicates=run.rng.randint(0, 10))
    with run.sampling():
        first, joiner = _join_mid_batch(run, protocol)
        # Then the batch ends, the partitions move, both members finish the stream
        run.wait_caught_up(first, joiner, timeout=20)
        assert first.stop() == 0, first.log_tail()
        assert joiner.stop() == 0, joiner.log_tail()
    shares = effects_by_pid(run.database_url, run.schema)
    assert shares.get(joiner.pid, 0) > 0, f"the joiner applied nothing: {shares}"
    assert shares.get(first.pid, 0) > 0, f"the slow member applied nothing: {shares}"
    # A revoke that outlived the batch would drop its offsets: say so if it happened.
    assert "will not be committed" not in first.log(), first.log_tail()
    run.finish()


@scenario(
    "7c", "last commit in rebalance", fault="last commit during coop rebalance", partitions=2,
    min_rounds=2,
)  # fmt: skip
def test_last_commit_of_a_kept_partition_meets_a_cooperative_rebalance(run: Run) -> None:
    """7c: the held batch is the whole stream, so its offset commit is the last one and
    goes out while the cooperative rebalance is still completing.

    The members own every event in the database, so the group must end with its
    offsets at the end while they run — and certainly after a clean stop.
    Whether the commit meets the rebalance is a race (kinbox bug: ~3 in 4 runs
    here), so quick mode runs it twice.
    """
    run.produce(count=run.rng.randint(20, 40))
    with run.sampling():
        first, joiner = _join_mid_batch(run, "cooperative")
        # Then both members stay, and the group commits every offset
        try:
            run.wait_caught_up(first, joiner, timeout=15)
        finally:
            assert first.stop() == 0, first.log_tail()
            assert joiner.stop() == 0, joiner.log_tail()
    run.finish()


@scenario("8", "handler > max.poll.interval", fault="handler 8-9 s > max.poll 6 s")
def test_handler_longer_than_max_poll_interval(run: Run) -> None:
    produced = run.produce()
    count = 1 if run.rounds == 1 else run.rng.randint(1, 2)
    slow = sorted(
        {f"{run.group}-ev-{run.rng.randint(30, len(produced.records) // 2)}"
         for _ in range(count)}
    )  # fmt: skip
    env = {
        "KINBOX_MAX_POLL_INTERVAL": str(MAX_POLL),
        "KINBOX_SESSION_TIMEOUT": str(MAX_POLL),
        "FAULT_SLEEP": "0.002",
        "FAULT_SLOW_IDS": ",".join(slow),
        "FAULT_SLOW_SECONDS": f"{run.rng.uniform(MAX_POLL + 2, MAX_POLL + 3):.2f}",
    }
    with run.sampling():
        # Given a handler that takes longer than max.poll.interval on some events
        worker = run.factory.start("slow", env=env)
        # Then the runner holds the batch (pauses, keeps polling) ...
        worker.wait_log(HOLD)
        # ... and the same member, never expelled, commits everything
        run.wait_caught_up(worker, timeout=120)
        assert worker.stop() == 0, worker.log_tail()
    deliveries = read_deliveries(run.log_dir)
    for event_id in slow:
        times = dict(deliveries.holds.get(event_id, []))
        assert times.keys() == {"begin", "end"}, (event_id, deliveries.holds)
        held = times["end"] - times["begin"]
        assert held > MAX_POLL + 1, f"{event_id} held only {held:.1f}s"
    _assert_stayed_in_the_group(worker)
    redelivered = deliveries.redelivered
    assert not redelivered, f"redelivered (the member lost its partitions): {redelivered}"
    outcome = run.finish()
    # Nothing was delivered twice, so the inbox had nothing to suppress.
    assert outcome.duplicates_suppressed == 0, outcome
    assert outcome.deliveries == len(produced.records), outcome


def _assert_stayed_in_the_group(worker: Worker) -> None:
    # Up to the SIGTERM that stopped it: closing the consumer revokes, rightly.
    log = worker.log().split("SIGTERM: finishing")[0]
    problems = [
        pattern
        for pattern in (
            r"(?i)maximum poll interval",  # librdkafka: "... exceeded ...: leaving group"
            r"lost \[",  # kinbox's on_lost: expelled
            r"revoked \[\(",
            r"offset commit (rejected|on revoke dropped)",
            r"will not be committed",
        )
        if re.search(pattern, log)
    ]
    assigned = len(re.findall(r"assigned \[\(", log))
    assert not problems and assigned == 1, (
        f"the member left or was expelled ({problems}, assigned {assigned}x)\n{worker.log_tail(60)}"
    )
