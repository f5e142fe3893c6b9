"""Scenario 15: the dead-letter topic stops taking dead letters while the worker runs.

The start-up check passed (the worker created the dead-letter topic itself);
then an operator lowers its ``max.message.bytes`` below any dead letter. The
policy (docs/failures.md, "A dead letter the broker will not take"): only the poison
event's partition waits, exactly at the record whose dead letter was
refused, with capped backoff and an ERROR naming the dead-letter topic and
the broker's reason on every try; the other partitions drain. Once the limit
is raised again the dead letter goes out and the partition drains by itself.
What must hold throughout: no offset past the waiting record, nothing lost,
nothing applied twice, each poison event dead-lettered once.
"""

from __future__ import annotations

from tests.support.fault_run import Run
from tests.support.records import Headers, committed, set_max_message_bytes
from tests.support.scenario import scenario
from tests.support.waiting import wait_for

TOO_SMALL = 200
"""A ``max.message.bytes`` no dead letter fits: its ``kinbox.dlq.*`` headers alone are larger."""
KAFKA_DEFAULT = 1_048_588
UNDELIVERED = "not delivered"


def _stream(run: Run, count: int, every: int) -> tuple[frozenset[str], int]:
    """Events ``1..count`` round-robin; every ``every``-th (a multiple of the
    partition count) is poison, so all poison events are on partition 0.

    Returns the poison ids and the offset of the first one on partition 0.
    """
    assert every % run.partitions == 0
    items: list[tuple[int, Headers, str | None]] = []
    for n in range(1, count + 1):
        event_id = f"{run.group}-ev-{n}"
        items.append((n % run.partitions, [("event-id", event_id.encode())], event_id))
    produced = run.produce_plan(items)
    poison = frozenset(f"{run.group}-ev-{n}" for n in range(every, count + 1, every))
    first = min(o for (p, o), i in produced.records.items() if p == 0 and i in poison)
    return poison, first


@scenario("15", "undeliverable dead letter", fault="DLQ max.message.bytes lowered")
def test_dead_letter_topic_refuses_dead_letters_after_the_start(run: Run) -> None:
    _hold_then_drain(run, run.events)
    # (finish checks: each poison event dead-lettered once, nothing lost or doubled)
    run.finish()


def _hold_then_drain(run: Run, count: int) -> None:
    every = run.rng.choice([9, 12, 15])
    dlq = f"{run.topic}.dlq"
    # Given a worker that started normally (it created the dead-letter topic)
    worker = run.factory.start(
        "worker",
        env={"FAULT_POISON_EVERY": str(every), "FAULT_SLEEP": "0.001"},
        args=["--max-attempts", "1"],
        batch_max_messages=run.rng.choice([5, 20, 50]),
    )
    wait_for(lambda: "kinbox worker consuming" in worker.log(), 60, "the worker")
    # When the dead-letter topic's limit is lowered below any dead letter
    set_max_message_bytes(run.bootstrap, dlq, TOO_SMALL)
    # ... and events arrive, poison ones among them on partition 0
    poison, first = _stream(run, count, every)
    run.expect_dead = poison
    assert run.produced is not None
    ends = run.produced.end_offsets()
    held = {**ends, 0: first}

    def offsets() -> dict[int, int]:
        return committed(run.bootstrap, run.group, run.topic, run.partitions)

    with run.sampling():
        # Then partition 0 holds exactly at its first poison record, the
        # others drain, and every try says so at ERROR
        wait_for(lambda: offsets() == held, 90, f"partition 0 at {first}, the others at their ends")
        tries = worker.log().count(UNDELIVERED)
        wait_for(lambda: worker.log().count(UNDELIVERED) >= tries + 2, 30, "two more tries")
        assert offsets() == held
        lines = [line for line in worker.log().splitlines() if UNDELIVERED in line]
        assert all("ERROR" in line and repr(dlq) in line for line in lines), lines[0]
        assert all("MSG_SIZE_TOO_LARGE" in line for line in lines), lines[0]
        assert all(f"{run.topic}[0]@{first}" in line for line in lines), lines[0]
        # When the operator raises the limit again
        set_max_message_bytes(run.bootstrap, dlq, KAFKA_DEFAULT)
        # Then the same worker drains partition 0 by itself
        run.wait_caught_up(worker)
        assert worker.stop() == 0, worker.log_tail()
