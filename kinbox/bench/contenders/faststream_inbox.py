"""FastStream with a hand-written inbox: what a team on Python's most used Kafka framework writes.

FastStream's confluent broker, one subscriber, messages one at a time (its
default). Per message one transaction on an async psycopg connection: claim
the id in ``processed_events`` with ``INSERT … ON CONFLICT DO NOTHING
RETURNING`` and, when a row comes back, write the effect. ``AckPolicy.ACK``
commits the offset after the handler returns. Its per-message logging is
off (``logger=None``), so the comparison is fair to it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import psycopg

from kinbox.bench import effects
from kinbox.bench.contenders.common import claim_one, effect_row, event_id
from kinbox.bench.spec import ChildSpec
from kinbox.core.failpoints import failpoint

log = logging.getLogger(__name__)


def run(spec: ChildSpec) -> None:
    """Consume until SIGTERM."""
    asyncio.run(_main(spec))


async def _main(spec: ChildSpec) -> None:
    from faststream import AckPolicy
    from faststream.confluent import KafkaBroker
    from faststream.confluent.annotations import KafkaMessage

    kafka = dict(spec.kafka)
    instance = kafka.pop("group.instance.id", None)
    session = int(kafka.pop("session.timeout.ms", "10000"))
    broker = KafkaBroker(spec.bootstrap_servers, logger=None, config=kafka)  # type: ignore[arg-type]
    claim = claim_one(spec.schema)
    effect = effects.insert_one(spec.schema, spec.table)
    conn = await psycopg.AsyncConnection.connect(spec.database_url)

    @broker.subscriber(
        spec.topic,
        group_id=spec.group,
        group_instance_id=instance,
        session_timeout_ms=session,
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.ACK,
    )
    async def handle(msg: KafkaMessage) -> None:
        raw: Any = msg.raw_message
        try:
            row = effect_row(event_id(raw.headers()), raw.partition(), raw.offset(), raw.value())
            async with conn.transaction():
                cursor = await conn.execute(claim, (spec.group, row[0], spec.topic, row[1], row[2]))
                if await cursor.fetchone() is not None:
                    await conn.execute(effect, row)
        except Exception:
            # FastStream's logger is off, and AckPolicy.ACK acknowledges a
            # failed message too: say so, or the check would be the first to know.
            log.exception("handler failed at %s[%s]@%s", spec.topic, raw.partition(), raw.offset())
            raise
        failpoint("after_db_commit")

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with broker:
        await broker.start()
        await stopping.wait()
    await conn.close()
