"""The benchmark harness's quick mode on the real stack.

It proves that every contender runs in every scenario that applies to it and
passes its check, that the check fails loudly when effects are wrong, and
that ``kinbox bench`` removes what it created, also when interrupted. Nothing
here looks at a speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql
from psycopg.conninfo import make_conninfo

from kinbox.bench import effects, outside, report, stages
from kinbox.bench.command import EXIT_FAILED, EXIT_INTERRUPTED, execute
from kinbox.bench.contenders import CONTENDERS, SLOW, Contender
from kinbox.bench.harness import NO_CONNECT, Harness
from kinbox.bench.scenarios import BY_NAME as SCENARIO_NAMES
from kinbox.bench.scenarios import SCENARIOS, Scenario
from kinbox.bench.spec import Sizes, Target
from kinbox.devstack.stack import Stack

ROOT = Path(__file__).resolve().parents[2]


def _target(stack: Stack, prefix: str | None = None) -> Target:
    return Target(
        stack.bootstrap_servers, stack.database_url, prefix or f"kbt_{uuid.uuid4().hex[:10]}"
    )


def _leftovers(stack: Stack, prefix: str) -> list[str]:
    """Topics, groups and schemas named after ``prefix`` that still exist."""
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    found = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    groups = admin.list_consumer_groups().result(10).valid
    found += [g.group_id for g in groups if g.group_id and g.group_id.startswith(prefix)]
    with psycopg.connect(stack.database_url) as conn:
        found += [
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)
            )
        ]
    return found


def _bench_processes(prefix: str) -> list[int]:
    """Our contender processes still running for ``prefix`` (found by their spec)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"KINBOX_BENCH_SPEC=" in environ and prefix.encode() in environ:
            pids.append(int(entry.name))
    return pids


@pytest.mark.timeout(900)
def test_quick_mode_runs_and_checks_every_contender_in_every_scenario(
    stack: Stack, tmp_path: Path
) -> None:
    target = _target(stack)
    sizes = Sizes.quick()
    # slow-keys and its own contenders: tests/integration/test_bench_keys.py
    scenarios = [s for s in SCENARIOS if s.name != "slow-keys"]
    contenders = [c for c in CONTENDERS if c.name not in SLOW]
    harness = Harness(target, sizes, scenarios, contenders, log_dir=tmp_path, stream_bar=False)
    try:
        outcome = harness.run()
    finally:
        left = harness.cleanup()
    assert left == [], left
    assert not outcome.failures, [(r.scenario, r.contender, r.error) for r in outcome.failures]
    # Without a Kafka Connect URL the CDC contender sits out the outbox scenario, and
    # says so (tests/integration/test_cdc_bench.py runs it with one); only a storm
    # over before its membership changes goes untimed, and says so.
    assert NO_CONNECT in outcome.skipped
    assert outcome.notes["checkpoint"] == "before each scenario, after the preload"
    storm_notes = [s for s in outcome.skipped if s.startswith("storm · ")]
    assert all("membership changes took effect" in s for s in storm_notes)
    assert len(storm_notes) + 1 == len(outcome.skipped), outcome.skipped

    ran = {(r.scenario, r.contender) for r in outcome.results}
    inside = [s for s in scenarios if s.kind not in ("outbox", "latency")]
    expected = {(s.name, c) for s in inside for c in s.contenders}
    expected |= {("empty", c) for c in SCENARIO_NAMES["large"].contenders}
    outbox_runs = ("trigger", "relay-backlog", "relay-notify", "relay-sql", "relay-polling")
    expected |= {("outbox", n) for n in outbox_runs}
    # The effects are timed to their COMMIT where the server records commit times
    # (the stack started here does), else to their INSERT, with no `committed` stage
    with psycopg.connect(stack.database_url) as conn:
        exact = effects.commit_time_available(conn)
    method = "commit timestamp" if exact else "insert time (lower bound)"
    timed = [s for s in stages.ORDER[1:] if exact or s != "committed"]
    offers = [o.name for o in outside.offers(sizes)]
    assert offers == ["latency-200-plain", "latency-200-idempotent", "latency-400-plain"]
    expected |= {(o, c) for o in offers for c in SCENARIO_NAMES["latency"].contenders}
    assert ran == expected

    for r in outcome.results:
        if r.scenario == "outbox" or r.scenario.startswith("latency-"):
            continue
        assert r.distinct > 0 and r.peak_rss > 0, r
        exactly_once = r.contender != "inbox-off"
        if exactly_once:
            assert r.effects == r.distinct and r.duplicates_applied == 0, r
        else:
            assert r.duplicates_applied == r.effects - r.distinct, r
    by = {(r.scenario, r.contender): r for r in outcome.results}
    # Producer duplicates: suppressed by every inbox, applied again without one.
    for scenario, share in (("retries10", 0.10), ("retries50", 0.50)):
        dup = round(sizes.events * share)
        assert by[(scenario, "kinbox-batch")].duplicates_suppressed == dup
        assert by[(scenario, "kinbox-each")].duplicates_suppressed == dup
        assert by[(scenario, "ceiling")].duplicates_suppressed == dup
        assert by[(scenario, "inbox-off")].duplicates_applied == dup
    # A replay is nothing but duplicates.
    for contender in ("kinbox-each", "kinbox-batch", "article", "faststream", "ceiling"):
        replay = by[("replay", contender)]
        assert replay.duplicates_suppressed == replay.records == replay.distinct
    assert by[("replay", "inbox-off")].duplicates_applied == by[("replay", "inbox-off")].distinct
    # Every contender really was killed between its DB commit and offset commit,
    # repeatedly, and each kill left committed effects past the committed offsets.
    assert sizes.kills >= 2
    for name in SCENARIO_NAMES["redelivery"].contenders:
        redelivery = by[("redelivery", name)]
        assert redelivery.kills == sizes.kills, name
        assert redelivery.notes["redelivered"] >= sizes.kills, redelivery
    # Members joined and left; a storm over before all its changes has no figure.
    for name in SCENARIO_NAMES["redelivery"].contenders:
        storm = by[("storm", name)]
        assert storm.notes["members"] >= 2, storm
        if storm.notes["changes"] < 4:
            assert storm.rate is None and any(f"storm · {name} ·" in s for s in storm_notes)
    assert (
        by[("redelivery", "inbox-off")].duplicates_applied
        == by[("redelivery", "inbox-off")].notes["redelivered"]
    )
    for offer in offers:
        for name in SCENARIO_NAMES["latency"].contenders:
            latency = by[(offer, name)]
            # Every event produced was applied exactly once, and timed
            assert latency.effects == latency.distinct == latency.records > 0, latency
            assert latency.notes["samples"] == latency.records
            assert latency.p50_ms is not None and latency.p99_ms is not None
            assert latency.latency_method == method, latency
            notes = latency.notes
            # The consumer's leg from the broker's append is never longer than the whole
            # (but for the append time's truncation to a millisecond); the INSERT
            # comes before the commit. The notes hold them to 0.01 ms: so are they compared.
            p50, p99 = round(latency.p50_ms, 2), round(latency.p99_ms, 2)
            assert notes["from_append_p99_ms"] <= p99 + 1, latency
            assert notes["insert_p50_ms"] <= p50, latency
            assert notes["windows"] and notes["worst_window_p99_ms"] >= max(
                w["p99_ms"] for w in notes["windows"]
            )
            worst = notes["worst_window_p99_ms"]
            assert 0 < notes["worst_window_from_append_p99_ms"] <= worst + 1, latency
            assert notes["cpu_us_per_event"] > 0 and notes["cores"] > 0, latency
            # The feeder's clock started once its producer was ready (its id, if idempotent)
            assert notes["producer_ready_ms"] >= 0, latency
            # The machine probe watched the run from its own process.
            assert 0 <= notes["steal_pct"] <= 100 and 0 <= notes["busy_pct"] <= 100, latency
            assert 0 <= notes["wake_late_p50_ms"] <= notes["wake_late_p99_ms"], latency
            # kinbox's worker stamped every event's stages (quick mode: 1 in 1), in order
            legs = [leg["stage"] for leg in notes["stages"]]
            if name.startswith("kinbox"):
                assert legs == timed, latency
                assert all(leg["samples"] == latency.records for leg in notes["stages"])
            else:
                assert legs == [s for s in timed if s in ("appended", "inserted", "committed")]
    for name in SCENARIO_NAMES["drain"].contenders:
        drain = by[("drain", name)]
        assert drain.notes["cpu_us_per_event"] > 0 and drain.notes["startup_s"] > 0, drain
    assert by[("outbox", "relay-sql")].records == round(sizes.outbox_sql_rate * 0.5)
    trigger = by[("outbox", "trigger")].notes
    assert trigger["single_on_us"] > 0 and trigger["multi100_off_us"] > 0, trigger
    backlog = by[("outbox", "relay-backlog")]
    assert backlog.effects == sizes.outbox_rows
    # The relay's CPU per row, and the machine's share busy while rows were pending
    # (none when the first look found the small backlog already sent).
    assert backlog.notes["cpu_us_per_row"] > 0, backlog
    assert 0 < backlog.notes.get("busy_pct", 50) <= 100, backlog
    assert by[("outbox", "relay-notify")].p50_ms is not None

    data = report.to_json(target, sizes, outcome)
    json.dumps(data, default=str)
    text = report.markdown(data, outcome)
    assert "FAILED" not in text
    for each in contenders:
        assert each.label in text
    assert _leftovers(stack, target.prefix) == []


@pytest.mark.timeout(300)
def test_a_user_who_may_not_checkpoint_gets_the_runs_and_a_note_saying_so(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a database user with CREATE on the database, but no right to CHECKPOINT
    role = f"kbt_user_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(conn.info.dbname), sql.Identifier(role)
            )
        )
    target = _target(stack)
    target = Target(
        target.bootstrap_servers, make_conninfo(stack.database_url, user=role), target.prefix
    )
    clean = [c for c in SCENARIOS if c.name == "clean"]
    batch = [c for c in CONTENDERS if c.name == "kinbox-batch"]
    harness = Harness(target, Sizes.quick(), clean, batch, log_dir=tmp_path, stream_bar=False)
    try:
        # When it runs a scenario
        outcome = harness.run()
    finally:
        harness.cleanup()
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    # Then the run is timed and checked all the same, and the notes say why no
    # checkpoint came before it
    assert not outcome.failures and [r.ok for r in outcome.results] == [True]
    note = str(outcome.notes["checkpoint"])
    assert note.startswith("not run: ") and "CHECKPOINT" in note, note


def test_time_ordered_ids_are_what_the_inbox_claims(stack: Stack, tmp_path: Path) -> None:
    # Given the large scenario (random ids preloaded) with time-ordered event ids
    target = _target(stack)
    large = [c for c in SCENARIOS if c.name == "large"]
    batch = [c for c in CONTENDERS if c.name == "kinbox-batch"]
    sizes = replace(Sizes.quick(), event_ids="time-ordered")
    harness = Harness(target, sizes, large, batch, log_dir=tmp_path, stream_bar=False)
    try:
        # When it runs
        outcome = harness.run()
        with psycopg.connect(stack.database_url) as conn:
            claimed = [
                str(row[0])
                for row in conn.execute(
                    sql.SQL("SELECT event_id FROM {} WHERE topic <> 'preloaded'").format(
                        sql.Identifier(f"{target.prefix}_large", "processed_events")
                    )
                )
            ]
    finally:
        harness.cleanup()
    # Then both runs pass their check, and what kinbox claimed on the large
    # table are the workload's version-7 ids, every event once
    assert not outcome.failures and [r.ok for r in outcome.results] == [True, True]
    assert claimed and all(uuid.UUID(i).version == 7 for i in claimed)
    assert len(set(claimed)) == len(claimed) == sizes.scaled(batch[0].scale)


def test_wrong_effects_fail_the_check_and_are_never_a_figure(stack: Stack, tmp_path: Path) -> None:
    # Given two contenders that promise exactly once and break it: one applies
    # producer duplicates again (no claim), one silently drops events.
    doubling = Contender(
        "doubling", "applies duplicates",
        "kinbox.bench.contenders.kinbox_runner:run_inbox_off", exactly_once=True,
    )  # fmt: skip
    dropping = Contender("dropping", "drops events", "tests.support.bench_contenders:run_dropping")
    honest = next(c for c in CONTENDERS if c.name == "kinbox-batch")
    scenario = Scenario(
        "retries10", "producer retries 10%", "steady",
        contenders=("doubling", "dropping", "kinbox-batch"), duplicates=0.10,
    )  # fmt: skip
    target = _target(stack)
    # When the benchmark runs them
    status = execute(
        target, Sizes.quick(), [scenario], [doubling, dropping, honest],
        out_dir=tmp_path, progress=False, log_dir=tmp_path, json_path=str(tmp_path / "out.json"),
    )  # fmt: skip
    # Then it fails, names both, and reports no figure for them
    assert status == EXIT_FAILED
    data = json.loads((tmp_path / "bench.json").read_text())
    assert json.loads((tmp_path / "out.json").read_text())["runs"] == data["runs"]
    errors = {r["contender"]: r["error"] for r in data["runs"] if not r["ok"]}
    assert set(errors) == {"doubling", "dropping"}
    assert "duplicate effects" in errors["doubling"]
    assert "have no effect" in errors["dropping"]
    summaries = {s["contender"]: s for s in data["summaries"]}
    for name in ("doubling", "dropping"):
        assert summaries[name]["rate"] is None and not summaries[name]["ok"]
    assert summaries["kinbox-batch"]["ok"]
    table = (tmp_path / "bench.md").read_text()
    assert table.count("**FAILED**") == 2
    assert _leftovers(stack, target.prefix) == []


def _bench(stack: Stack, log: Path, prefix: str, *args: str) -> subprocess.Popen[bytes]:
    """``kinbox bench`` in a process of its own, its output into ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kinbox", "bench", "--prefix", prefix,
             "--bootstrap-servers", stack.bootstrap_servers,
             "--database-url", stack.database_url, *args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ},
        )  # fmt: skip


def _interrupt(proc: subprocess.Popen[bytes], signum: int, log: Path) -> str:
    """Send ``signum``; return the output once the benchmark has exited 130."""
    try:
        proc.send_signal(signum)
        status = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert status == EXIT_INTERRUPTED, output
    assert "everything it made is removed" in output
    return output


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_bench_removes_everything_it_created(
    stack: Stack, tmp_path: Path, signum: int
) -> None:
    prefix = f"kbi_{uuid.uuid4().hex[:10]}"
    log = tmp_path / "bench.log"
    proc = _bench(stack, log, prefix, "--scenario", "clean", "--contender", "article",
                  "--events", "40000", "--repeat", "1")  # fmt: skip
    try:
        # Given a benchmark in the middle of a run: effects are being written
        table = sql.Identifier(prefix, "e_clean_article_0")
        deadline = time.monotonic() + 120
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            while True:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "no effect written in 120s"
                try:
                    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
                    if row and row[0] > 0:
                        break
                except psycopg.errors.UndefinedTable:
                    pass
                time.sleep(0.1)
        assert _bench_processes(prefix)
    except BaseException:
        proc.kill()
        raise
    # When it is interrupted
    _interrupt(proc, signum, log)
    # Then it exits 130 having removed its topics, groups, schema and processes
    assert _leftovers(stack, prefix) == []
    assert _bench_processes(prefix) == []


@pytest.mark.timeout(300)
def test_interrupted_preload_is_cancelled_on_the_server(stack: Stack, tmp_path: Path) -> None:
    prefix = f"kbp_{uuid.uuid4().hex[:10]}"
    log = tmp_path / "bench.log"
    # Given a benchmark loading more rows into processed_events than it could in
    # the time the interrupt is given (10M take about a minute here)
    proc = _bench(stack, log, prefix, "--quick", "--scenario", "large", "--contender", "ceiling",
                  "--large-rows", "100000000")  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            loading = f'INSERT INTO "{prefix}_large"%generate_series%'
            while not conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s",
                (loading,),
            ).fetchone():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the preload did not start in 120s"
                time.sleep(0.1)
    except BaseException:
        proc.kill()
        raise
    # When it is interrupted, Then the statement is cancelled rather than left to
    # run on holding its locks, so the cleanup can drop the schema at once
    output = _interrupt(proc, signal.SIGINT, log)
    assert "error ignored in rollback" not in output
    assert _leftovers(stack, prefix) == []


def test_the_warm_up_consumes_all_it_produced_and_leaves_no_topic(stack: Stack) -> None:
    from benchmarks.warmup import TIMESTAMPS, warm

    moved = warm(stack.bootstrap_servers, seconds=0.5)
    # A round produces 5,200 records to each kind of topic and consumes them
    # all before the next: the broker's append-time branch is driven as much
    # as the producer-time one.
    assert set(moved) == set(TIMESTAMPS), moved
    rounds = moved["CreateTime"] // 5_200
    assert rounds >= 1 and moved == {kind: 5_200 * rounds for kind in TIMESTAMPS}, moved
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    deadline = time.monotonic() + 30
    while True:
        left = [t for t in admin.list_topics(timeout=10).topics if t.startswith("kinbox_warmup_")]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == []
