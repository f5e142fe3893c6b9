"""The slow-keys scenario's pure parts: its rate, its headline, its contenders, its options."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from kinbox.bench import command, report, slowkeys
from kinbox.bench.command import bench
from kinbox.bench.contenders import BY_NAME, SLOW, Contender
from kinbox.bench.contenders.parallel_consumer import jdbc
from kinbox.bench.effects import Timed
from kinbox.bench.results import RunResult, summarise
from kinbox.bench.scenarios import ALL
from kinbox.bench.scenarios import BY_NAME as SCENARIOS
from kinbox.bench.spec import Sizes, Target
from kinbox.core.errors import KinboxError


def _timed(inserted: float, committed: float | None) -> Timed:
    return Timed(0, 0, 0.0, inserted, committed)


def test_the_rate_runs_from_the_first_commit_to_the_last() -> None:
    rows = [_timed(1.0, 1.5), _timed(2.0, 2.5), _timed(3.0, 3.5)]
    assert slowkeys._rate(rows) == pytest.approx(1.0)
    # Without commit times, the inserts'
    assert slowkeys._rate([_timed(1.0, None), _timed(1.5, None)]) == pytest.approx(2.0)
    assert slowkeys._rate([_timed(1.0, 1.0)]) is None


def test_the_headline_gives_key_order_over_partition_order_and_parallel_consumer() -> None:
    def run(contender: str, rate: float, cpu: float) -> RunResult:
        return RunResult(
            "slow-keys", contender, 0, rate=rate,
            notes={"cpu_us_per_event": cpu, "cores": 0.5},
        )  # fmt: skip

    runs = [
        run("kinbox-partition-order", 150.0, 900.0),
        run("kinbox-key-order", 2400.0, 400.0),
        run("parallel-consumer", 1200.0, 300.0),
    ]
    headline = report.headline(summarise(runs))
    assert headline["slow_keys_key_vs_partition"] == pytest.approx(16.0)
    assert headline["slow_keys_key_vs_parallel_consumer"] == pytest.approx(2.0)
    assert headline["slow_keys_pc_cpu_us_per_event"] == 300.0
    assert headline["slow_keys_key_cores"] == 0.5
    # A duplicate applied by the at-least-once contender leaves its ratio out
    runs[2].duplicates_applied = 3
    assert report.headline(summarise(runs))["slow_keys_key_vs_parallel_consumer"] is None


def test_slow_keys_has_its_own_contenders_and_no_other_scenario_runs_them() -> None:
    assert SCENARIOS["slow-keys"].contenders == SLOW
    assert not set(SLOW) & set(ALL)
    assert BY_NAME["parallel-consumer"].exactly_once is False
    quick = Sizes.quick()
    assert (quick.slow_events, quick.slow_keys) == (200, 20)
    assert (Sizes().slow_events, Sizes().slow_keys, Sizes().key_concurrency) == (10_000, 1_000, 16)


def test_a_contender_that_cannot_run_says_why() -> None:
    assert BY_NAME["kinbox-partition-order"].missing() is None
    absent = Contender("x", "x", "m:f", needs="no_such_package_kinbox")
    assert absent.missing() == "needs no_such_package_kinbox (pip install 'kinbox[bench]')"
    told = Contender("y", "y", "m:f", requires="kinbox.bench.contenders.keyorder:key_order_missing")
    reason = told.missing()
    assert reason is None or "ordering='key'" in reason


def test_the_java_contender_reaches_postgresql_over_tcp() -> None:
    assert jdbc("postgresql://bench:pw@127.0.0.1:5433/kb") == (
        "jdbc:postgresql://127.0.0.1:5433/kb", "bench", "pw",
    )  # fmt: skip
    assert jdbc("host=db user=u dbname=d")[0] == "jdbc:postgresql://db:5432/d"
    with pytest.raises(KinboxError, match="TCP"):
        jdbc("host=/var/run/postgresql user=u dbname=d")


def test_cli_passes_the_slow_keys_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def execute(target: Target, sizes: Sizes, scenarios: Any, contenders: Any, **kw: Any) -> int:
        seen.update(sizes=sizes, scenarios=scenarios)
        return 0

    monkeypatch.setattr(command, "execute", execute)
    result = CliRunner().invoke(
        bench,
        ["--bootstrap-servers", "b:1", "--database-url", "postgresql://x",
         "--scenario", "slow-keys", "--slow-events", "500", "--slow-keys", "50",
         "--key-concurrency", "32"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [s.name for s in seen["scenarios"]] == ["slow-keys"]
    sizes = seen["sizes"]
    assert (sizes.slow_events, sizes.slow_keys, sizes.key_concurrency) == (500, 50, 32)
