"""A parked row blocks its key until `kinbox outbox requeue` puts it back, then goes out first."""

from __future__ import annotations

import json

from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from kinbox.devstack.stack import Stack
from producer_outbox.writer import enqueue
from tests.support.database import Conn
from tests.support.outbox import (
    consume,
    count,
    migrate_outbox,
    outbox_command,
    outbox_rows,
    running_relay,
)
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

LIMIT = 1000  # the topic's max.message.bytes; the client's own limit stays at 1 MB


def _topic_with_limit(stack: Stack, limit: int) -> tuple[AdminClient, str]:
    name = create_topic(
        stack.bootstrap_servers, partitions=3, prefix="parked",
        config={"max.message.bytes": str(limit)},
    )  # fmt: skip
    return AdminClient({"bootstrap.servers": stack.bootstrap_servers}), name


def _raise_limit(admin: AdminClient, topic: str, limit: int) -> None:
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(limit),
                        incremental_operation=AlterConfigOpType.SET)
        ],
    )  # fmt: skip
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_parked_row_holds_its_key_until_requeued_and_then_goes_out_first(
    stack: Stack, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    admin, topic = _topic_with_limit(stack, LIMIT)
    others = [f"other-{n}" for n in range(6)]

    def put(key: str, n: int, payload: object | None = None) -> str:
        return str(enqueue(db, topic, payload or {"n": n}, key=key, schema=schema))

    # Given key k: a row that goes out, then one over the topic's size limit
    first = put("k", 0)
    bad = put("k", 1, b"x" * (LIMIT * 5))
    early_others = [put(key, 10 + n) for n, key in enumerate(others[:3])]
    with running_relay(stack, schema, max_attempts=3, backoff_base=0.3, backoff_max=0.3):
        wait_for(lambda: count(db, schema, f"id = '{bad}' AND attempts >= 1") == 1)
        # and, once it is failing, later rows of k and rows of other keys
        held = [put("k", 2), put("k", 3)]
        late_others = [put(key, 20 + n) for n, key in enumerate(others[3:])]
        # When the relay gives up on it (parks it after max_attempts)
        wait_for(lambda: count(db, schema, f"id = '{bad}' AND status = 'dead'") == 1)
        every_other = early_others + late_others
        wait_for(
            lambda: count(db, schema, "aggregateid LIKE 'other-%' AND status = 'sent'") == 6,
            what="other keys published meanwhile",
        )
        # Then the other keys flowed (neighbours of the bad record included), the
        # rows behind it wait untouched, and nothing of k after it went out
        rows = {r[0]: r for r in outbox_rows(db, schema)}
        assert all(rows[i][2] == "sent" for i in every_other)
        assert [rows[i][2:] for i in held] == [("pending", 0, None)] * 2
        assert rows[bad][3] == 3 and "SIZE" in (rows[bad][4] or "")
        state = json.loads(outbox_command(stack, schema, "status", "--json").stdout)
        assert state["dead"] == 1 and state["blocked"] == 1
        (blocked,) = state["blocked_keys"]
        assert (blocked["key"], blocked["parked_id"], blocked["held"]) == ("k", bad, 2)
        in_kafka = consume(stack, topic, 1 + 6, linger=1.0)
        assert [r.event_id for r in in_kafka if r.key == "k"] == [first]

        # When the cause is fixed and the operator requeues, first as a dry run
        _raise_limit(admin, topic, 10 * LIMIT)
        dry = outbox_command(stack, schema, "requeue", "--key", "k", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "would requeue 1 parked rows of 1 keys; 2 rows held" in dry.stdout
        assert count(db, schema, "status = 'dead'") == 1
        done = outbox_command(stack, schema, "requeue", "--key", "k")
        assert done.returncode == 0, done.stderr
        assert "requeued 1 parked rows of 1 keys" in done.stdout
        wait_for(lambda: count(db, schema, "status = 'sent'") == 1 + 3 + 6, what="all sent")
    # Then the requeued row went out before the rows held behind it
    received = consume(stack, topic, 10, linger=1.0)
    assert [r.event_id for r in received if r.key == "k"] == [first, bad, *held]
    assert {r.event_id for r in received} == {first, bad, *held, *every_other}
    assert count(db, schema, "status = 'dead'") == 0


def test_requeue_by_id_key_or_all_and_dry_run(stack: Stack, schema: str, db: Conn) -> None:
    # Given parked rows of keys a (two), b (one) and a pending row behind a
    migrate_outbox(db, schema)
    ids = [str(enqueue(db, "t", {"n": n}, key=k, schema=schema)) for n, k in enumerate("aabab")]
    db.execute(
        f"UPDATE {schema}.outbox SET status = 'dead', attempts = 10, last_error = 'boom'"
        " WHERE id = ANY(%s::uuid[])",
        (ids[:3],),
    )

    def run(*args: str) -> str:
        result = outbox_command(stack, schema, "requeue", *args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    # When the operator looks first, nothing changes
    assert "would requeue 3 parked rows of 2 keys; 2 rows held" in run("--all", "--dry-run")
    assert count(db, schema, "status = 'dead'") == 3
    # One row by id: only that row, back to pending with a clean slate
    assert "requeued 1 parked rows of 1 keys" in run("--id", ids[2])
    assert outbox_rows(db, schema, f"id = '{ids[2]}'")[0][2:] == ("pending", 0, None)
    # A key's rows, then the rest
    assert "requeued 2 parked rows of 1 keys; 1 rows held" in run("--key", "a")
    assert "requeued 0 parked rows" in run("--all")
    assert count(db, schema, "status = 'pending' AND attempts = 0") == 5
