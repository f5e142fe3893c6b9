"""examples/lessons, run as the README's demo runs it: outbox → Kafka → inbox, exactly once."""

from __future__ import annotations

import uuid

from examples.lessons.demo import run
from kinbox.devstack.stack import Stack


def test_demo_flow_applies_every_committed_completion_once(stack: Stack, schema: str) -> None:
    # Given the demo's flow: a relay SIGKILLed between publish and mark, duplicates
    # re-published by hand, and business transactions rolled back after enqueueing
    report = run(
        stack.bootstrap_servers,
        stack.database_url,
        schema=schema,
        group=f"progress-{uuid.uuid4().hex[:8]}",
        users=3,
        lessons=6,
        duplicates=5,
        say=lambda _line: None,
    )

    # Then every committed completion was applied exactly once, none of the rolled-back ones
    assert report.relay_killed
    assert report.completions == 18 and report.rolled_back == 6
    assert report.outbox_sent == 18
    assert report.applied == report.distinct_applied == 18
    assert report.events_of_rolled_back == 0
    assert report.exactly_once
