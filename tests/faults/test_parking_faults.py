"""Scenario 30: parked keys through a crash, then released by replaying their dead letters.

The fault app's handler parks keys (``FAULT_PARK_KEYS``) and dead-letters
every few events while a file exists (``FAULT_HOLD_*``,
:mod:`tests.support.effect_app`). A worker dies at a COMMIT mid-run; its
successor works through the rest. Then each key with a dead letter must
have exactly its later events parked, in partition order and in key order.
The fix deployed, ``kinbox dlq replay`` re-publishes the dead letters and
releases their keys; every event then ends applied exactly once, each key's
effects in the order its events were produced.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
from click.testing import CliRunner
from psycopg import sql

from kinbox.cli.main import main
from tests.support.fault_run import Run
from tests.support.records import Produced, key_of, read_topic
from tests.support.scenario import scenario
from tests.support.waiting import wait_for

KEYS = 12
"""Keys over the events: a multiple of the partitions, so each key stays in one."""


def _seq(event_id: str) -> int:
    return int(event_id.rsplit("-", 1)[1])


def _rows(run: Run, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(run.database_url, autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(sql.Identifier(run.schema))).fetchall()


@scenario(
    "30", "parked keys: crash, then release by replay ({case})",
    fault="SIGKILL at a COMMIT, dead letters replayed",
    cases={"partition": {"concurrency": 0}, "key": {"concurrency": 6}},
)  # fmt: skip
def test_parked_keys_survive_a_crash_and_replay_releases_them_in_order(
    run: Run, concurrency: int
) -> None:
    run.factory.concurrency = concurrency
    every = run.rng.choice([7, 11, 13])
    hold = run.log_dir / "hold"
    hold.touch()
    env = {
        "FAULT_PARK_KEYS": "1", "FAULT_HOLD_EVERY": str(every), "FAULT_HOLD_FILE": str(hold),
        "FAULT_SLEEP": "0.002",
    }  # fmt: skip
    produced = run.produce(keys=KEYS)
    run.dead_letter_copies = 2  # the victim's dead letters may go out again
    with run.sampling():
        # Given a worker that parks keys and dies at one of its COMMITs
        victim = run.factory.start(
            "victim", failpoints=f"before_db_commit=kill@{run.rng.randint(2, 6)}", env=env,
            batch_max_messages=run.rng.choice([10, 50]),
        )  # fmt: skip
        assert victim.wait(60) == -signal.SIGKILL, victim.log_tail()
        # When its successor works through the rest
        restarted = run.factory.start("restarted", env=env)
        run.wait_caught_up(restarted)
        # Then each key's first held event is dead-lettered and its later events parked
        by_key: dict[str, list[int]] = {}
        for event_id in produced.ids:
            by_key.setdefault(key_of(event_id, KEYS), []).append(_seq(event_id))
        dead: set[int] = set()
        parked: set[int] = set()
        for seqs in by_key.values():
            seqs.sort()
            first = next((n for n in seqs if n % every == 0), None)
            if first is not None:
                dead.add(first)
                parked.update(n for n in seqs if n > first)
        status = dict(_rows(run, "SELECT event_id, status FROM {}.processed_events"))
        assert {_seq(i) for i, s in status.items() if s == "dead_lettered"} == dead
        assert {_seq(i) for i, s in status.items() if s == "parked"} == parked
        assert {_seq(i) for (i,) in _rows(run, "SELECT event_id FROM {}.parked_events")} == parked
        # And when the fix is deployed and the dead letters replayed
        hold.unlink()
        result = CliRunner().invoke(main, [
            "dlq", "replay", "--topic", f"{run.topic}.dlq", "--bootstrap-servers", run.bootstrap,
            "--database-url", run.database_url, "--schema", run.schema,
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert f"released {len(parked)} parked event(s)" in result.output, result.output
        wait_for(
            lambda: _rows(run, "SELECT count(*) FROM {}.parked_keys") == [(0,)], 60,
            "every key released and free",
        )  # fmt: skip
        assert restarted.stop() == 0, restarted.log_tail()
    # Then every event is applied once (the replayed records counted in), and
    # each key's effects follow the order its events were produced in
    again = read_topic(run.bootstrap, run.topic)
    records = {(r.partition, r.offset): r.header("event-id") or "?" for r in again}
    run.produced = Produced(run.topic, run.partitions, records, KEYS)
    run.replayed = frozenset(i for i in produced.ids if _seq(i) in dead)
    run.finish()
    order = _rows(run, "SELECT event_id FROM {}.effects ORDER BY seq")
    seen: dict[str, int] = {}
    for (event_id,) in order:
        key, n = key_of(str(event_id), KEYS), _seq(str(event_id))
        assert n > seen.get(key, -1), f"{event_id} applied after {key}'s event {seen[key]}"
        seen[key] = n
