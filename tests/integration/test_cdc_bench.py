"""The benchmark's CDC contender in quick mode, on the real stack with Kafka Connect + Debezium.

The outbox scenario runs the relay, then Debezium on the same table; each run
passes its check, and nothing of the benchmark is left behind: no topic, no
schema, no connector, no replication slot, no publication. Nothing here looks
at a speed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from kinbox.bench import report
from kinbox.bench.contenders import CONTENDERS
from kinbox.bench.harness import Harness
from kinbox.bench.scenarios import BY_NAME
from kinbox.bench.spec import Sizes, Target
from kinbox.devstack.connect import KafkaConnect
from kinbox.devstack.stack import Stack
from producer_outbox.connect_api import ConnectClient
from tests.integration.test_bench import _leftovers


@pytest.mark.timeout(600)
def test_quick_outbox_scenario_times_debezium_beside_the_relay_and_removes_everything(
    stack: Stack, connect: KafkaConnect, tmp_path: Path
) -> None:
    prefix = f"kbc_{uuid.uuid4().hex[:10]}"
    target = Target(
        stack.bootstrap_servers, stack.database_url, prefix, connect_url=connect.rest_url
    )
    sizes = Sizes.quick()
    harness = Harness(
        target, sizes, [BY_NAME["outbox"]], CONTENDERS, log_dir=tmp_path, stream_bar=False
    )
    try:
        outcome = harness.run()
    finally:
        left = harness.cleanup()
    assert left == [], left
    assert not outcome.failures, [(r.contender, r.error) for r in outcome.failures]
    assert outcome.skipped == []
    by = {r.contender: r for r in outcome.results}
    assert set(by) == {
        "trigger", "relay-backlog", "relay-notify", "relay-sql", "relay-polling",
        "debezium-backlog", "debezium-latency",
    }  # fmt: skip
    # Every committed row of the backlog came through Debezium, once each in a clean run
    backlog = by["debezium-backlog"]
    assert backlog.effects == backlog.distinct == sizes.outbox_rows
    assert backlog.records == sizes.outbox_rows + backlog.notes["repeats"]
    assert backlog.notes["resume_to_last_s"] >= backlog.notes["resume_to_first_s"]
    latency = by["debezium-latency"]
    assert latency.records == sizes.outbox_samples and latency.p50_ms is not None
    text = report.markdown(report.to_json(target, sizes, outcome), outcome)
    assert "outbox via Debezium, backlog" in text and "FAILED" not in text
    assert f"Kafka Connect {connect.version}, Debezium {connect.debezium_version}" in text

    # Nothing is left: topics (Debezium's heartbeat topic too), schemas, groups ...
    assert _leftovers(stack, prefix) == []
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    assert not [t for t in admin.list_topics(timeout=10).topics if prefix in t]
    # ... connectors, replication slots and publications
    assert not [n for n in ConnectClient(connect.rest_url).names() if n.startswith(prefix)]
    with psycopg.connect(stack.database_url) as conn:
        slots = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE starts_with(slot_name, %s)"
            " UNION ALL SELECT pubname FROM pg_publication WHERE starts_with(pubname, %s)",
            (prefix, prefix),
        ).fetchall()
    assert slots == []
