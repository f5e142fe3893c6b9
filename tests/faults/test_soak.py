"""Scenario soak: members churned for a long while under each assignment protocol.

The real stack, for ``KINBOX_SOAK_SECONDS`` per assignment protocol (eager —
``range`` or ``roundrobin``, seeded —, cooperative-sticky and KIP-848's
``group.protocol=consumer``): three topics of 12 partitions (a per-event
handler, a batch handler, an async handler; :mod:`tests.support.soak_app`),
a producer process writing to them without pause and logging every record
the broker acknowledged (:mod:`tests.support.soak_producer`), and every few
seconds one seeded thing done to the group: a member started, SIGTERMed,
SIGKILLed, SIGSTOPped for a moment or past the session timeout (expelled, then
thawed as a zombie), or the producer SIGKILLed and restarted
(:mod:`tests.support.soak_churn`). The handlers are slow now and then, fail
their first tries, always fail (poison), or catch a refused statement with and
without a savepoint. While it churns, every committed offset is checked
against ``processed_events`` as it moves (:mod:`tests.support.soak_offsets`).
Then the producer stops, the members still there catch up and stop (each
must exit 0 on SIGTERM), a fresh member drains, and the checker
(:mod:`tests.support.soak_check`) compares what the topics hold with the
effects: lost 0, applied twice 0, per-key order kept, every verdict as the
handler meant it, every dead letter on its topic, and lag 0. A failed round
prints every check, the failed ones' ids and the members' log lines about them
(:mod:`tests.support.soak_report`).

Duration: ``KINBOX_SOAK_SECONDS`` is the churn of *each* protocol. In quick
mode (``make test``) it is 20 s, so the three protocols make the 60-second
soak ``make test`` runs (well under a minute each with the start, the
catch-up and the drain, when nothing stalls; a stall costs 45 s at the
catch-up and 45 s at the drain); in long mode 120 s a round. ``KINBOX_SOAK_SECONDS=1800 pytest
tests/faults/test_soak.py -k kip848`` soaks one protocol for half an hour, and
hours work the same way: the producer, the checker and the offset watch keep
their state on disk or in the database, and each member's log is trimmed to
its head and tail once it ended. ``KINBOX_SOAK_RATE`` sets the producer's new
events a second (default 100).
"""

from __future__ import annotations

import os
import time

import psycopg
import pytest
from psycopg import sql

from tests.support.fault_run import Run
from tests.support.launch import FAST_TIMINGS, PROTOCOLS
from tests.support.records import committed, log_ends
from tests.support.scenario import long_mode, replay_hint, scenario
from tests.support.soak_app import EFFECTS_DDL, TABLE
from tests.support.soak_check import check, lag
from tests.support.soak_churn import Churn
from tests.support.soak_logs import collapse, shape
from tests.support.soak_offsets import OffsetWatch
from tests.support.soak_producer import ProducerProcess
from tests.support.soak_report import report
from tests.support.topics import create_topic
from tests.support.workers import Worker

SECONDS_ENV = "KINBOX_SOAK_SECONDS"
RATE_ENV = "KINBOX_SOAK_RATE"
SESSION_TIMEOUT = {"eager": FAST_TIMINGS["session_timeout"], "cooperative": FAST_TIMINGS[
    "session_timeout"], "kip848": 10.0}  # fmt: skip
"""Each protocol's session timeout: KIP-848's is the broker's (kinbox.devstack.kafka)."""
BREAKER = {"KINBOX_BREAKER_PAUSE": "5"}
"""The circuit breaker at its default threshold, with a short pause, as every timing of the
fault suite is short: after a rebalance a member may meet a failing event at the head of ten
partitions at once, and each probe that fails pauses it again."""
CATCH_UP = 600.0
"""Seconds the members left at the end (and then the drain) have at most to commit everything,
or twice as long as the churn lasted, if longer: under eager rebalancing the backlog grows
nearly as fast as the producer writes while the group churns."""
LAG_EVERY = 30.0
"""Seconds between two readings of the group's lag while it churns (printed: a soak of hours
shows whether its backlog grows)."""
STALL = 45.0
"""Seconds without any committed offset moving after which a catch-up has failed: longer than
a member's join, a session timeout, a slow handler and the retry backoff put together."""


def soak_seconds() -> float:
    """The churn per protocol: ``KINBOX_SOAK_SECONDS``, else 20 s quick, 120 s long."""
    return float(os.environ.get(SECONDS_ENV) or (120 if long_mode() else 20))


def catch_up_cap() -> float:
    """The longest a catch-up may take (see :data:`CATCH_UP`)."""
    return max(CATCH_UP, 2 * soak_seconds())


@scenario(
    "soak", "member churn ({case})", fault="churned members, {case}", partitions=12,
    cases={protocol: {"protocol": protocol} for protocol in PROTOCOLS},
)  # fmt: skip
@pytest.mark.timeout(soak_seconds() + 2 * catch_up_cap() + 600)
def test_churn_soak(run: Run, protocol: str, request: pytest.FixtureRequest) -> None:
    seconds = soak_seconds()
    topics = [run.topic, f"{run.topic}-batch", f"{run.topic}-async"]
    for topic in topics[1:]:
        create_topic(run.bootstrap, topic, run.partitions, replication_factor=-1)
    with psycopg.connect(run.database_url, autocommit=True) as db:
        db.execute(sql.SQL(EFFECTS_DDL).format(sql.Identifier(run.schema), sql.Identifier(TABLE)))
    kafka = dict(PROTOCOLS[protocol])
    if protocol == "eager":
        kafka["partition.assignment.strategy"] = run.rng.choice(["range", "roundrobin"])
    run.factory.app = "tests.support.soak_app:app"
    env = {"SOAK_TOPIC": run.topic, "SOAK_LOG_DIR": str(run.log_dir), **BREAKER}
    producer = ProducerProcess(
        run.bootstrap, topics, run.partitions, seed=str(run.rng.getrandbits(64)),
        prefix=run.group, log_path=run.log_dir / "producer.log",
        rate=float(os.environ.get(RATE_ENV) or 100),
    )  # fmt: skip
    churn = Churn(run.factory, run.rng, kafka, env, SESSION_TIMEOUT[protocol], producer,
                  run.log_dir)  # fmt: skip
    churn.say(f"soak {protocol} {kafka}: {seconds:g}s, seed of the round in the line above")
    lags: list[int] = []
    try:
        with OffsetWatch(run.bootstrap, run.database_url, run.schema, run.group, topics,
                         run.partitions) as watch:  # fmt: skip
            # Given a producer that never pauses and two members
            producer.start()
            churn.join()
            churn.join()
            # When the group churns for `seconds`
            began = time.monotonic()
            next_at = began + run.rng.uniform(1, 4)
            next_lag = began + LAG_EVERY
            while time.monotonic() < began + seconds:
                if time.monotonic() >= next_at:
                    churn.act()
                    next_at = time.monotonic() + run.rng.uniform(1.5, 5)
                if time.monotonic() >= next_lag:
                    lags.append(lag(run.bootstrap, run.group, topics, run.partitions))
                    churn.say(f"lag {lags[-1]} records")
                    next_lag += LAG_EVERY
                churn.tick()
                time.sleep(0.1)
            # Then, once the producer stopped, the members left catch up and stop
            _end(run, churn, producer, topics)
    finally:
        producer.kill()
        churn.tick(thaw_all=True)
        run.factory.kill_all()
    churn.say("checking")
    result = check(run.bootstrap, run.database_url, run.schema, run.group, topics,
                   run.partitions, producer.log_path, run.log_dir)  # fmt: skip
    run.outcome = result.outcome
    churn.say("checked")
    result.figures["offset watch readings"] = watch.samples
    result.figures["records the offset watch saw passed"] = watch.checked
    result.figures[f"largest lag seen (every {LAG_EVERY:g}s)"] = max(lags, default=0)
    if not watch.samples:
        churn.findings.append("the offset watch never got a reading of the committed offsets")
    result.add("committed offset past an unapplied record, or back", watch.violations, watch.count)
    result.add("members and the ending (exits, hangs, catch-up, final drain)", churn.findings)
    title = (f"[soak] {protocol} {kafka}: {seconds:g}s of churn, {churn.actions} actions, "
             f"{len(churn.members)} members")  # fmt: skip
    replay = f"{replay_hint()} {SECONDS_ENV}={seconds:g} pytest '{request.node.nodeid}'"
    text = report(title, result, run.log_dir, churn.summary(), replay)
    if result.failed:
        raise AssertionError(text)
    print(text)


def _end(run: Run, churn: Churn, producer: ProducerProcess, topics: list[str]) -> None:
    """Stop the producer, let the members left catch up, stop them, drain with a fresh one.

    What goes wrong here is a finding of the round (kept in ``churn.findings``),
    not an exception: the checker still runs, and the report says both.
    """
    churn.tick(thaw_all=True)
    status = producer.stop()
    churn.say(f"producer stopped: {status}")
    if status != 0:
        churn.findings.append(f"the producer exited {status} on SIGTERM (None: it hung)")
    ends = {t: log_ends(run.bootstrap, t, run.partitions) for t in topics}
    survivors = [m.worker for m in churn.alive() if m.termed is None]
    stuck = _catch_up(run, churn, ends, "the members left")
    churn.say(stuck or "caught up")
    if stuck:
        churn.findings.append(
            "\n".join([stuck, *(_stuck(w) for w in survivors if w.proc.poll() is None)])
        )
    churn.stop_all()
    drain = churn.start_drain()
    try:
        # Joined first: a SIGTERM before its handler is in place would end it unheard.
        drain.wait_assigned(90)
    except AssertionError as exc:
        churn.findings.append(f"final drain: {exc}")
    stuck = _catch_up(run, churn, ends, "the final drain")
    churn.say(stuck or "drained")
    if stuck:
        churn.findings.append(f"{stuck}\n{_stuck(drain)}")
    try:
        status = drain.stop(60) if drain.proc.poll() is None else drain.proc.returncode
    except AssertionError as exc:  # it ignored SIGTERM
        churn.findings.append(f"final drain: {exc}")
        return
    churn.say(f"drain stopped: {status}")
    if status != 0:
        churn.findings.append(f"the drain exited {status} on SIGTERM\n{drain.log_tail(30)}")


def _catch_up(run: Run, churn: Churn, ends: dict[str, dict[int, int]], who: str) -> str:
    """Wait until the group committed every partition to its end; say why not, if it did not.

    It did not when no committed offset moved for :data:`STALL` seconds (a
    partition that waits for ever, or a group that lost its members), or
    after :func:`catch_up_cap` seconds in all.
    """
    began = moved = time.monotonic()
    last: dict[str, dict[int, int]] = {}
    while True:
        churn.tick()
        got = {t: committed(run.bootstrap, run.group, t, run.partitions) for t in ends}
        behind = [f"{t}[{p}] at {got[t].get(p)} of {end}" for t in ends
                  for p, end in ends[t].items() if got[t].get(p, 0) < end]  # fmt: skip
        if not behind:
            return ""
        now = time.monotonic()
        if got != last:
            last, moved = got, now
        if now - moved > STALL or now - began > catch_up_cap():
            return (f"{who}: no committed offset moved for {now - moved:.0f}s "
                    f"({now - began:.0f}s in all); behind: {', '.join(behind[:12])}")  # fmt: skip
        time.sleep(0.5)


def _stuck(worker: Worker) -> str:
    """Where a member that should have caught up is: stacks into its log, its last lines here."""
    worker.dump_stacks()
    lines = [line[:300] for line in worker.log().splitlines() if line[:2] == "20"][-200:]
    last = collapse([(shape(line), line) for line in lines])[-12:]
    return (
        f"--- {worker.name} (pid {worker.pid}), last log lines (stacks dumped into "
        f"{worker.log_path}) ---\n" + "\n".join(f"    {line}" for line in last)
    )
