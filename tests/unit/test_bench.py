"""The benchmark harness's pure parts: workloads, the check, summaries, the report, the CLI."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kinbox.bench import command, report
from kinbox.bench.cdc import Arrival, check_backlog
from kinbox.bench.command import bench
from kinbox.bench.contenders import CONTENDERS
from kinbox.bench.effects import CheckFailed, EffectTally, gap, redelivered
from kinbox.bench.harness import BenchResult, rotated
from kinbox.bench.progress import Bar
from kinbox.bench.resources import Interrupted
from kinbox.bench.results import RunResult, summarise
from kinbox.bench.runs import kill_spacing
from kinbox.bench.spec import PREFIX_PATTERN, Sizes, Target
from kinbox.bench.workload import FAR, NEAR, build
from kinbox.core.errors import ConfigurationError
from producer_outbox.ids import new_event_id


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5])
def test_workload_has_the_asked_duplicates_near_and_far(share: float) -> None:
    work = build(2000, share, seed=3)
    assert work.distinct == 2000
    assert work.deliveries == 2000 + round(2000 * share)
    first: dict[int, int] = {}
    distances = []
    for position, index in enumerate(work.order):
        if index in first:
            distances.append(position - first[index])
        else:
            first[index] = position
    assert len(distances) == round(2000 * share)
    # A duplicate always comes after its original; about half within a batch, half later.
    assert all(d > 0 for d in distances)
    near = sum(d <= 2 * NEAR for d in distances)
    if distances:
        assert abs(near - len(distances) / 2) <= len(distances) * 0.1
        assert max(distances) >= min(FAR, 2000 // 2)


def test_workload_head_keeps_the_same_events_and_their_duplicates() -> None:
    work = build(1000, 0.5, seed=1)
    head = work.head(100)
    assert head.ids == work.ids[:100]
    assert head.order == [i for i in work.order if i < 100]
    assert head.distinct == 100


def test_workload_ids_are_random_or_time_ordered_as_asked() -> None:
    random_ids = [uuid.UUID(i) for i in build(500, seed=2).ids]
    assert {i.version for i in random_ids} == {4}
    assert build(500, seed=2).ids == [str(i) for i in random_ids]  # the seed decides them
    ordered = build(500, 0.3, seed=2, ordered=True)
    ids = [uuid.UUID(i) for i in ordered.ids]
    assert {i.version for i in ids} == {7} and len(set(ids)) == 500
    # In event order, and after every id made before the workload.
    assert ordered.ids == sorted(ordered.ids)
    earlier = new_event_id()
    later = build(10, seed=2, ordered=True)
    assert str(earlier) < later.ids[0]


def test_sizes_refuse_an_unknown_kind_of_event_id() -> None:
    assert Sizes(event_ids="time-ordered").ordered_ids and not Sizes().ordered_ids
    with pytest.raises(ConfigurationError, match="event_ids"):
        Sizes(event_ids="sequential")


def test_exactly_once_check() -> None:
    assert EffectTally(10, 10).check(10, exactly_once=True) == 0
    with pytest.raises(CheckFailed, match="duplicate effects"):
        EffectTally(11, 10).check(10, exactly_once=True)
    with pytest.raises(CheckFailed, match="have no effect"):
        EffectTally(9, 9).check(10, exactly_once=True)
    # Applied twice and missing once: as many rows as events, still wrong.
    with pytest.raises(CheckFailed, match="have no effect"):
        EffectTally(10, 9).check(10, exactly_once=True)


def test_at_least_once_check_counts_duplicates_applied() -> None:
    assert EffectTally(13, 10).check(10, exactly_once=False) == 3
    with pytest.raises(CheckFailed, match="have no effect"):
        EffectTally(13, 9).check(10, exactly_once=False)


def test_redelivered_gap_is_the_database_frontier_past_the_committed_offsets() -> None:
    assert gap({0: 10, 1: 5, 2: 7}, {0: 8, 1: 5}) == 2 + 0 + 7


def test_a_batch_the_next_member_never_reached_is_redelivered_once_not_per_kill() -> None:
    # Given a first member killed after applying partition 0's batch (104 records)
    assert redelivered({0: 104}, {0: 104}, {}, exactly_once=False) == 104
    # When the restarted member's first batch is partition 1's and it is killed too,
    # partition 0's batch is still past the committed offsets, but only partition
    # 1's is this member's: partition 0's is delivered again once, after the restart.
    for exactly_once in (False, True):
        assert redelivered({0: 104, 1: 100}, {1: 100}, {}, exactly_once=exactly_once) == 100
    # Had it taken partition 0 again, an at-least-once member applies it again ...
    assert redelivered({0: 104}, {0: 104}, {}, exactly_once=False) == 104
    # ... and an exactly-once member leaves no trace of the batch it suppressed,
    # which a restarted member re-reads from the committed offset.
    assert redelivered({0: 104}, {}, {}, exactly_once=True) == 104
    assert redelivered({0: 104, 2: 9}, {2: 9}, {0: 104, 2: 4}, exactly_once=True) == 5
    # A member committing every event that applied fresh ones on partition 2, then
    # was killed after re-applying partition 0's pending event (suppressed: no row).
    assert redelivered({0: 5, 2: 9}, {2: 9}, {0: 4, 2: 9}, exactly_once=True) == 1


def _run(contender: str, rate: float | None, rep: int = 0, **kw: object) -> RunResult:
    return RunResult("clean", contender, rep, rate=rate, **kw)  # type: ignore[arg-type]


def test_summary_is_the_median_with_its_spread_and_ratios() -> None:
    runs = [
        _run("ceiling", 100.0), _run("ceiling", 120.0, 1), _run("ceiling", 110.0, 2),
        _run("article", 10.0), _run("kinbox-batch", 55.0),
    ]  # fmt: skip
    by = {s.contender: s for s in summarise(runs)}
    assert (by["ceiling"].rate, by["ceiling"].rate_min, by["ceiling"].rate_max) == (110, 100, 120)
    assert by["kinbox-batch"].vs_ceiling == pytest.approx(0.5)
    assert by["kinbox-batch"].vs_article == pytest.approx(5.5)


def test_a_latency_note_is_the_median_over_the_runs_as_the_whole_is() -> None:
    runs = [
        RunResult("latency-1000-plain", "kinbox-each", rep, p50_ms=p50, p99_ms=p99,
                  notes={"from_append_p50_ms": a50, "from_append_p99_ms": a99,
                         "steal_pct": steal, "samples": rep, "worst_window_p99_ms": a99,
                         "worst_window_from_append_p99_ms": a50, "cpu_us_per_event": 300.0})
        for rep, (p50, p99, a50, a99, steal) in enumerate(
            [(6.0, 50.0, 5.0, 45.0, 3.0), (5.0, 40.0, 4.0, 30.0, 1.0), (9.0, 90.0, 8.0, 80.0, 9.0)]
        )
    ]  # fmt: skip
    runs.append(
        RunResult("latency-1000-plain", "hand", 0, p50_ms=2.0, p99_ms=20.0,
                  notes={"cpu_us_per_event": 400.0})
    )  # fmt: skip
    summary, hand = summarise(runs)
    assert (summary.p50_ms, summary.p99_ms) == (6.0, 50.0)
    assert summary.notes == {
        "from_append_p50_ms": 5.0, "from_append_p99_ms": 45.0, "steal_pct": 3.0, "samples": 2,
        "worst_window_p99_ms": 45.0, "worst_window_from_append_p99_ms": 5.0,
        "cpu_us_per_event": 300.0,
    }  # fmt: skip
    headline = report.headline([summary, hand])
    assert (headline["each_1000_plain_p50_ms"], headline["each_1000_plain_p99_ms"]) == (6.0, 50.0)
    assert headline["each_1000_plain_worst_window_p99_ms"] == 45.0
    assert headline["each_1000_plain_worst_window_from_append_p99_ms"] == 5.0
    assert headline["each_1000_plain_cpu_vs_hand"] == pytest.approx(0.75)
    assert headline["hand_1000_plain_p99_ms"] == 20.0


def test_the_per_event_handlers_drain_is_also_set_beside_its_hand_written_twin() -> None:
    runs = [
        RunResult("drain", name, 0, rate=rate, notes={"rate_with_startup": rate / 2})
        for name, rate in (("kinbox-each", 60.0), ("kinbox-batch", 300.0), ("hand", 200.0),
                           ("hand-each", 75.0))
    ]  # fmt: skip
    headline = report.headline(summarise(runs))
    assert headline["each_drain_vs_hand"] == pytest.approx(0.3)
    assert headline["batch_drain_vs_hand"] == pytest.approx(1.5)
    assert headline["hand_each_drain_vs_hand"] == pytest.approx(0.375)
    assert headline["each_drain_vs_hand_each"] == pytest.approx(0.8)
    assert headline["each_drain_with_startup_vs_hand_each"] == pytest.approx(0.8)
    # Without its twin the per-event handler has its ratio over the set-based inbox only.
    alone = report.headline(summarise([r for r in runs if r.contender != "hand-each"]))
    assert "each_drain_vs_hand_each" not in alone and "each_drain_vs_hand" in alone


def test_a_failed_run_leaves_no_figure_and_the_report_says_failed() -> None:
    runs = [_run("kinbox-batch", 50.0), _run("kinbox-batch", 40.0, 1).failed("2 duplicate effects")]
    runs.append(_run("inbox-off", 90.0, duplicates_applied=7))
    summaries = {s.contender: s for s in summarise(runs)}
    assert summaries["kinbox-batch"].rate is None and not summaries["kinbox-batch"].ok
    assert not summaries["inbox-off"].comparable
    outcome = BenchResult(results=runs)
    data = {
        "header": {"kafka": "4", "postgresql": {"version": "15", "fsync": "on",
                   "synchronous_commit": "on"}, "librdkafka": "2", "confluent_kafka": "2",
                   "python": "3", "faststream": "0.7", "cores": 2},
        "headline": report.headline(summarise(runs)),
    }  # fmt: skip
    text = report.markdown(data, outcome)
    assert "**FAILED**" in text and "2 duplicate effects" in text
    assert "7 duplicates applied" in text
    assert "50" not in text.split("**FAILED**")[0].splitlines()[-1]


def test_target_prefix_must_name_a_schema_and_topics() -> None:
    Target("b:9092", "postgresql://x", "kinbox_bench_ab12")
    for bad in ("Kinbox", "a", "bench-1", "x" * 41, "1abc"):
        with pytest.raises(ConfigurationError, match="prefix"):
            Target("b:9092", "postgresql://x", bad)


def test_quick_sizes_are_small_and_long_mode_loads_100m_rows() -> None:
    quick = Sizes.quick()
    assert quick.events < 1000 and quick.repeat == 1 and quick.large_rows < 100_000
    assert Sizes().long().large_rows == 100_000_000
    assert Sizes().scaled(0.025) >= Sizes().min_events


def test_cli_help_lists_the_options_a_user_needs() -> None:
    result = CliRunner().invoke(bench, ["--help"])
    assert result.exit_code == 0
    for option in ("--bootstrap-servers", "--database-url", "-X", "--scenario", "--events",
                   "--json", "--quick", "--prefix", "--long", "--connect-url",
                   "--event-ids"):  # fmt: skip
        assert option in result.output


def test_cli_refuses_a_bad_prefix_before_touching_anything() -> None:
    result = CliRunner().invoke(
        bench, ["--bootstrap-servers", "b:1", "--database-url", "postgresql://x", "--prefix", "X"]
    )
    assert result.exit_code == 2
    assert "prefix" in result.output


def test_target_connect_url_must_be_an_http_address() -> None:
    Target("b:9092", "postgresql://x", "kinbox_bench_ab12", connect_url="http://c:8083")
    for bad in ("c:8083", "ftp://c", "http://"):
        with pytest.raises(ConfigurationError, match="connect_url"):
            Target("b:9092", "postgresql://x", "kinbox_bench_ab12", connect_url=bad)


def _arrival(event: str, key: str, n: int, offset: int, partition: int = 0) -> Arrival:
    return Arrival(event, key, n, partition, offset, appended_ms=1000 + offset)


def test_debezium_backlog_check_counts_repeats_and_keeps_key_order() -> None:
    arrived = [
        _arrival("a", "k0", 0, 0), _arrival("b", "k1", 1, 0, partition=1),
        _arrival("c", "k0", 2, 1), _arrival("a", "k0", 0, 2),  # a restart re-sent "a"
    ]  # fmt: skip
    assert check_backlog({"a", "b", "c"}, arrived) == 1


@pytest.mark.parametrize(
    ("committed", "arrived", "reason"),
    [
        ({"a", "b"}, [_arrival("a", "k", 0, 0)], "1 of 2 committed rows never arrived"),
        ({"a"}, [_arrival("a", "k", 0, 0), _arrival("z", "k", 1, 1)], "1 records of no"),
        ({"a", "b"}, [_arrival("b", "k", 1, 0), _arrival("a", "k", 0, 1)], "out of commit order"),
    ],
    ids=["missing", "foreign", "order"],
)
def test_debezium_backlog_check_fails_loudly(
    committed: set[str], arrived: list[Arrival], reason: str
) -> None:
    with pytest.raises(CheckFailed, match=reason):
        check_backlog(committed, arrived)


def test_report_names_the_cdc_runs_and_says_when_it_was_skipped() -> None:
    from kinbox.bench.harness import NO_CONNECT

    runs = [
        RunResult(
            "outbox",
            "relay-backlog",
            0,
            rate=1000.0,
            notes={"cpu_us_per_row": 25.0, "busy_pct": 80.0},
        ),
        RunResult("outbox", "debezium-backlog", 0, rate=4000.0),
        RunResult("outbox", "debezium-latency", 0, p50_ms=12.0, p99_ms=20.0),
    ]
    headline = report.headline(summarise(runs))
    assert headline["debezium_vs_relay_backlog"] == pytest.approx(4.0)
    assert headline["debezium_p50_ms"] == 12.0
    assert (headline["relay_backlog_cpu_us_per_row"], headline["relay_backlog_busy_pct"]) == (
        25.0,
        80.0,
    )
    data = {
        "header": {"kafka": "4", "postgresql": {"version": "15", "fsync": "on",
                   "synchronous_commit": "on"}, "librdkafka": "2", "confluent_kafka": "2",
                   "python": "3", "faststream": "0.7", "cores": 2},
        "headline": headline,
    }  # fmt: skip
    text = report.markdown(data, BenchResult(results=runs, skipped=[NO_CONNECT]))
    assert "outbox via Debezium, backlog" in text and "COMMIT → consumer, Debezium" in text
    assert "--connect-url" in text


def test_cli_passes_every_option_to_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def execute(target: Target, sizes: Sizes, scenarios: Any, contenders: Any, **kw: Any) -> int:
        seen.update(target=target, sizes=sizes, scenarios=scenarios, contenders=contenders, **kw)
        return 0

    monkeypatch.setattr(command, "execute", execute)
    result = CliRunner().invoke(
        bench,
        ["--bootstrap-servers", "b:1", "--database-url", "postgresql://x",
         "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=PLAIN",
         "--scenario", "replay", "--scenario", "storm", "--contender", "ceiling",
         "--events", "500", "--repeat", "2", "--kills", "4", "--large-rows", "1000",
         "--latency-rate", "50", "--latency-rate", "70", "--latency-seconds", "2",
         "--latency-producer", "idempotent", "--latency-window", "0.5", "--stage-every", "0",
         "--kafka-version", "3.9.1", "--json", "out.json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    target = seen["target"]
    assert target.kafka == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    assert target.kafka_version == "3.9.1"
    assert [s.name for s in seen["scenarios"]] == ["replay", "storm"]
    assert [c.name for c in seen["contenders"]] == ["ceiling"]
    sizes = seen["sizes"]
    assert (sizes.events, sizes.repeat, sizes.kills, sizes.large_rows) == (500, 2, 4, 1000)
    assert (sizes.latency_rates, sizes.latency_producers) == ((50, 70), ("idempotent",))
    assert (sizes.latency_seconds, sizes.latency_window, sizes.stage_every) == (2.0, 0.5, 0)
    assert seen["json_path"] == "out.json"


def test_cli_default_prefix_is_unique_and_quick_mode_scales_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Target, Sizes]] = []

    def execute(target: Target, sizes: Sizes, *_args: Any, **_kw: Any) -> int:
        seen.append((target, sizes))
        return 0

    monkeypatch.setattr(command, "execute", execute)
    for _ in range(2):
        result = CliRunner().invoke(
            bench, ["--bootstrap-servers", "b:1", "--database-url", "postgresql://x", "--quick"]
        )
        assert result.exit_code == 0, result.output
    (first, quick), (second, _) = seen
    assert first.prefix != second.prefix
    assert PREFIX_PATTERN.match(first.prefix) and first.prefix.startswith("kinbox_bench_")
    assert quick == Sizes.quick()


def test_the_exit_status_is_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "execute", lambda *_a, **_k: command.EXIT_FAILED)
    result = CliRunner().invoke(bench, ["--bootstrap-servers", "b:1", "--database-url", "x"])
    assert result.exit_code == command.EXIT_FAILED


def test_repetitions_are_interleaved_in_a_rotated_order() -> None:
    orders = [[c.name for c in rotated(CONTENDERS, rep)] for rep in range(len(CONTENDERS))]
    # Every contender runs once per repetition, and each is first exactly once.
    assert all(sorted(order) == sorted(orders[0]) for order in orders)
    assert len({order[0] for order in orders}) == len(CONTENDERS)
    assert rotated([], 3) == []


@pytest.mark.parametrize("per_commit", [1, 167, 500])
def test_every_redelivery_kill_falls_before_the_end(per_commit: int) -> None:
    # Given commits of per_commit events (at most the contender's commit_size,
    # 500) and a member killed at its `every`-th commit after each (re)start,
    # whose last commit comes back after the restart
    deliveries, kills = 30_000, 3
    every = kill_spacing(deliveries, kills, 500)
    start, done = 0, 0
    while done < kills and start + every * per_commit <= deliveries:
        done += 1
        start += (every - 1) * per_commit
    # Then every kill happens before the topic is done
    assert done == kills
    assert kill_spacing(300, 2, 500) == 1


def test_an_interrupt_is_a_keyboard_interrupt_so_psycopg_cancels_the_statement() -> None:
    # psycopg cancels the running statement on the server only for
    # KeyboardInterrupt/SystemExit; the cleanup's DROP SCHEMA would wait for it.
    assert isinstance(Interrupted(2), KeyboardInterrupt)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_and_prints_lines_elsewhere() -> None:
    lines = io.StringIO()
    bar = Bar(2, lines)
    bar.begin("clean · ceiling · rep 1")
    bar.end()
    bar.say("*** FAILED: x")
    assert lines.getvalue().splitlines() == ["[1/2] clean · ceiling · rep 1 ...", "*** FAILED: x"]
    term = _Terminal()
    bar = Bar(2, term)
    bar.begin("clean · ceiling · rep 1")
    bar.update(0.5)
    bar.end()
    bar.close()
    assert "] 1/2  clean · ceiling · rep 1" in term.getvalue()
    assert f"[{'#' * 15}{'-' * 15}]" in term.getvalue()


def test_chart_draws_the_timed_runs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    runs = [_run("ceiling", 100.0), _run("ceiling", 120.0, 1), _run("kinbox-batch", 55.0)]
    data = {
        "header": {"kafka": "4", "postgresql": {"version": "15", "fsync": "on"}, "cores": 2},
        "summaries": [s.as_dict() for s in summarise(runs)],
    }
    assert report.chart(data, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    untimed = {**data, "summaries": [s.as_dict() for s in summarise([_run("ceiling", None)])]}
    assert not report.chart(untimed, tmp_path / "none.png")
