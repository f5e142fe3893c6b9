"""``kinbox worker --processes N``: static ids per member, members die with their supervisor.

Real processes on the real broker; the group's members are read back from
the broker (``describe_consumer_groups``), the members' liveness from /proc.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kinbox.cli.support import EXIT_FATAL
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.support.database import prepare_schema
from tests.support.waiting import wait_for
from tests.support.workers import Worker, workers

STATIC = {"group.instance.id": "svc"}
TWO = ["--processes", "2"]


def instance_ids(bootstrap: str, group: str) -> list[str] | None:
    """The ``group.instance.id`` of every member of ``group`` now (``None``: cannot tell yet)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        description = admin.describe_consumer_groups([group])[group].result(10)
    except KafkaException:
        return None  # the coordinator is still loading
    return sorted(m.group_instance_id or "" for m in description.members)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, or a pid now used by an unrelated process, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read()
    except FileNotFoundError:
        return False
    return fields[0] not in {"Z", "X"} and b"multiprocessing" in command


def member_pids(supervisor: Worker) -> list[int]:
    found = supervisor.wait_log(r"supervising 2 members: pids (\d+), (\d+)")
    return [int(found.group(1)), int(found.group(2))]


def test_members_get_their_own_static_ids_and_die_with_a_killed_supervisor(
    stack: Stack, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(partitions=4)
    tag = uuid.uuid4().hex[:8]
    group, schema = f"g-{tag}", f"procs_{tag}"
    prepare_schema(stack.database_url, schema)
    bootstrap = stack.bootstrap_servers
    with workers(bootstrap, stack.database_url, group, schema, topic, tmp_path) as factory:
        # Given two members started under one static id
        supervisor = factory.start("supervisor", args=TWO, kafka=STATIC)
        pids = member_pids(supervisor)
        # Then each joined the group under its own id (none fenced the other)
        wait_for(
            lambda: instance_ids(bootstrap, group) == ["svc-0", "svc-1"],
            60,
            "members svc-0 and svc-1 in the group",
        )
        assert all(alive(pid) for pid in pids), supervisor.log_tail()
        assert "failed fatally" not in supervisor.log(), supervisor.log_tail()
        # When the supervisor is SIGKILLed
        supervisor.signal(signal.SIGKILL)
        assert supervisor.wait(10) == -signal.SIGKILL
        # Then no member is left running, and the group empties
        wait_for(lambda: not any(alive(pid) for pid in pids), 40, "the members to exit")
        wait_for(lambda: instance_ids(bootstrap, group) == [], 40, "the group to empty")


def test_a_fenced_member_ends_the_whole_worker_with_its_status(
    stack: Stack, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(partitions=4)
    tag = uuid.uuid4().hex[:8]
    group, schema = f"g-{tag}", f"procs_{tag}"
    prepare_schema(stack.database_url, schema)
    bootstrap = stack.bootstrap_servers
    with workers(bootstrap, stack.database_url, group, schema, topic, tmp_path) as factory:
        supervisor = factory.start("supervisor", args=TWO, kafka=STATIC)
        pids = member_pids(supervisor)
        wait_for(lambda: instance_ids(bootstrap, group) == ["svc-0", "svc-1"], 60, "both members")
        # When another worker joins as svc-0 (a copy of the service started twice)
        intruder = factory.start("intruder", kafka={"group.instance.id": "svc-0"})
        # Then member 0 is fenced and exits 7, and the supervisor stops member 1
        # and exits with that status
        status = supervisor.wait(60)
        assert status == EXIT_FATAL, supervisor.log_tail()
        log = supervisor.log()
        assert "Static consumer fenced by other consumer with same group.instance.id" in log
        assert "exited with status 7 on its own; stopping the other 1" in log
        assert not any(alive(pid) for pid in pids)
        # The intruder, now the only svc-0, is unaffected
        assert intruder.proc.poll() is None, intruder.log_tail()
        assert intruder.stop() == 0, intruder.log_tail()
