"""The slow-keys benchmark scenario, tiny, on the real stack: every contender applies every record.

kinbox in partition order, kinbox in key order (where this kinbox has it;
otherwise skipped, and said so) and Confluent's parallel-consumer, a Java
program fetched and compiled here: a JVM piece that is missing fails the
test. Nothing here looks at a speed.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from kinbox.bench import effects, report
from kinbox.bench.contenders import BY_NAME, CONTENDERS, SLOW
from kinbox.bench.harness import Harness
from kinbox.bench.runs import Job, Stage
from kinbox.bench.scenarios import BY_NAME as SCENARIO_NAMES
from kinbox.bench.spec import Sizes, Target
from kinbox.devstack.stack import Stack
from tests.integration.test_bench import _leftovers


@pytest.mark.timeout(600)
def test_slow_keys_runs_each_contender_over_every_record(stack: Stack, tmp_path: Path) -> None:
    # Given 200 records over 20 keys in one partition, and the scenario's contenders
    prefix = f"kbk_{uuid.uuid4().hex[:10]}"
    target = Target(stack.bootstrap_servers, stack.database_url, prefix)
    sizes = replace(Sizes.quick(), slow_events=200, slow_keys=20)
    scenario = SCENARIO_NAMES["slow-keys"]
    contenders = [c for c in CONTENDERS if c.name in SLOW]
    harness = Harness(target, sizes, [scenario], contenders, log_dir=tmp_path, stream_bar=False)
    tallies: dict[str, effects.EffectTally] = {}
    try:
        # When the benchmark runs it
        outcome = harness.run()
        with psycopg.connect(stack.database_url) as conn:
            for r in outcome.results:
                job = Job(
                    scenario.name, BY_NAME[r.contender], r.rep, Stage("", {}, 0, 0),
                    target.schema, "",
                )  # fmt: skip
                tallies[r.contender] = effects.tally(conn, target.schema, job.table)
    finally:
        left = harness.cleanup()
    assert left == [], left
    assert not outcome.failures, [(r.contender, r.error) for r in outcome.failures]
    # Then every contender ran (key order only where this kinbox has it, else said so) ...
    key_order = BY_NAME["kinbox-key-order"].missing() is None
    expected = set(SLOW) if key_order else set(SLOW) - {"kinbox-key-order"}
    assert {r.contender for r in outcome.results} == expected
    assert set(tallies) == expected
    if not key_order:
        assert any(s.startswith("kinbox-key-order: ") for s in outcome.skipped), outcome.skipped
    # ... and its effect rows hold every record: once each for kinbox, at least once
    # for parallel-consumer
    for r in outcome.results:
        found = tallies[r.contender]
        assert found.distinct == r.distinct == r.records == sizes.slow_events, r
        if BY_NAME[r.contender].exactly_once:
            assert found.rows == sizes.slow_events, (r.contender, found)
        else:
            assert found.rows >= sizes.slow_events, (r.contender, found)
        # CPU is read in clock ticks: a tiny run may show none
        assert r.notes["cpu_us_per_event"] >= 0 and r.notes["cores"] >= 0, r
    text = report.markdown(report.to_json(target, sizes, outcome), outcome)
    assert "slow_keys_key_vs_partition" in text and "FAILED" not in text
    assert _leftovers(stack, prefix) == []
