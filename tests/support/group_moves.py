"""Moving a stopped group's offsets as an operator would, for the fault scenarios that replay.

Scenarios 22, 23 and 27 let a group apply everything, stop it, move or
delete its offsets, and publish more before it comes back.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.fault_run import Run
from tests.support.records import Produced, produce
from tests.support.waiting import wait_for


def move_offsets(run: Run, action: Callable[[AdminClient], None]) -> None:
    """Do ``action`` to the stopped group (retried while the broker still sees it leaving)."""
    admin = AdminClient({"bootstrap.servers": run.bootstrap})

    def done() -> bool:
        try:
            action(admin)
        except KafkaException as exc:
            # The group still has a member (leaving): not empty, or its member unknown to us.
            if any(word in str(exc).lower() for word in ("not empty", "unknown member")):
                return False
            raise
        return True

    wait_for(done, 30, "the group to be empty", interval=0.5)


def set_offsets(run: Run, offsets: dict[int, int]) -> Callable[[AdminClient], None]:
    def action(admin: AdminClient) -> None:
        parts = [TopicPartition(run.topic, p, o) for p, o in offsets.items()]
        request = ConsumerGroupTopicPartitions(run.group, parts)
        for future in admin.alter_consumer_group_offsets([request]).values():
            future.result(timeout=30)

    return action


def delete_group(run: Run) -> Callable[[AdminClient], None]:
    def action(admin: AdminClient) -> None:
        for future in admin.delete_consumer_groups([run.group]).values():
            future.result(timeout=30)

    return action


def apply_all(run: Run) -> None:
    """A worker applies everything produced so far, then stops cleanly."""
    worker = run.factory.start("first")
    run.wait_caught_up(worker)
    assert worker.stop() == 0, worker.log_tail()


def publish_more(run: Run, first: Produced, count: int, prefix: str) -> Produced:
    """Publish ``count`` more events; the round's records are both batches from now on."""
    later = produce(run.bootstrap, run.topic, count, run.partitions,
                    prefix=f"{run.group}-{prefix}", rng=run.rng)  # fmt: skip
    run.produced = Produced(run.topic, run.partitions, {**first.records, **later.records})
    return run.produced
