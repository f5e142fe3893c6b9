"""The outside scenarios' pieces that need no services: windows, stages, CPU, offers, argv."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kinbox.bench import deploy, effects, feeder, outside, spread, stages
from kinbox.bench.cpu import TICKS, cpu_seconds
from kinbox.bench.results import RunResult
from kinbox.bench.spec import PRODUCER_PROFILES, ChildSpec, Sizes
from kinbox.core.errors import ConfigurationError

pytestmark = pytest.mark.unit


def test_windows_cut_by_produce_time_and_the_worst_is_compared_with_the_run() -> None:
    # Given 10 s of 1 ms latencies and one bad second (100 ms) in the second window
    samples = [(t / 10, 1.0) for t in range(100)] + [(15 + t / 10, 100.0) for t in range(10)]
    found = spread.spread(samples, window_s=10.0)
    assert [(w.start_s, w.samples) for w in found.windows] == [(0.0, 100), (10.0, 10)]
    assert found.windows[0].p99_ms == 1.0 and found.windows[1].p50_ms == 100.0
    assert found.worst_p99_ms == 100.0 and found.max_ms == 100.0
    assert found.worst_vs_run == pytest.approx(100.0 / found.p99_ms)
    notes = found.as_notes()
    assert notes["worst_window_p99_ms"] == 100.0 and len(notes["windows"]) == 2


def test_a_window_with_a_single_sample_has_no_percentile() -> None:
    found = spread.windows([(0.0, 1.0), (0.5, 2.0), (20.0, 3.0)], window_s=10.0)
    assert [w.start_s for w in found] == [0.0]
    with pytest.raises(ValueError, match="two samples"):
        spread.spread([(0.0, 1.0)], 10.0)


def test_stages_chain_from_each_stage_to_the_nearest_earlier_one(tmp_path: Path) -> None:
    stamped = tmp_path / "stamps"
    stamped.write_text(
        "".join(
            f"{stage} t {p} {o} {base + shift:.6f}\n"
            for p, o, base in ((0, 0, 100.0), (1, 0, 200.0), (1, 1, 300.0))
            for stage, shift in (("fetched", 0.010), ("batch", 0.012), ("commit", 0.020))
        )
        + "fetched other 0 0 1.0\n"
    )
    times = stages.read_stamps(stamped, "t")
    times["produced"] = {(0, 0): 100.0, (1, 0): 200.0, (1, 1): 300.0}
    # The hand-written consumer has no batch stamp: its chain skips that stage.
    legs = stages.split(times, [(0, 0), (1, 0), (1, 1)])
    assert [(leg.stage, leg.after, leg.samples) for leg in legs] == [
        ("fetched", "produced", 3), ("batch", "fetched", 3), ("commit", "batch", 3),
    ]  # fmt: skip
    assert legs[-1].p50_ms == pytest.approx(8.0) and legs[-1].total_p99_ms == pytest.approx(20.0)
    del times["batch"]
    assert [leg.after for leg in stages.split(times, times["fetched"])] == ["produced", "fetched"]


def test_appended_times_are_read_and_unknown_ones_left_out(tmp_path: Path) -> None:
    acks = tmp_path / "acks"
    acks.write_text("0 5 12.500000\n1 7 -1.000000\n")
    assert stages.read_appended(acks) == {(0, 5): 12.5}
    assert stages.read_appended(tmp_path / "missing") == {}


def test_cpu_time_counts_the_process_and_its_descendants(tmp_path: Path) -> None:
    def stat(pid: int, ppid: int, ticks: tuple[int, int, int, int]) -> None:
        (tmp_path / str(pid)).mkdir()
        times = " ".join(str(t) for t in ticks)
        # pid (comm with a space) state ppid pgrp session tty tpgid flags 4 faults utime..cstime
        (tmp_path / str(pid) / "stat").write_text(
            f"{pid} (a b) S {ppid} 1 1 0 -1 0 0 0 0 0 {times} 20 0\n"
        )

    stat(10, 1, (100, 50, 7, 3))
    stat(11, 10, (10, 10, 0, 0))
    stat(12, 11, (5, 0, 0, 0))
    stat(13, 1, (999, 0, 0, 0))  # not ours
    assert cpu_seconds(10, tmp_path) == pytest.approx((160 + 20 + 5) / TICKS)
    assert cpu_seconds(99, tmp_path) is None
    assert cpu_seconds(os.getpid()) is not None


def test_every_profile_at_the_first_rate_and_the_first_profile_at_the_others() -> None:
    sizes = Sizes(latency_rates=(1000, 5000), latency_producers=("plain", "idempotent"))
    assert [o.name for o in outside.offers(sizes)] == [
        "latency-1000-plain", "latency-1000-idempotent", "latency-5000-plain",
    ]  # fmt: skip
    assert set(feeder.PROFILES) == set(PRODUCER_PROFILES)
    assert feeder.PROFILES["idempotent"]["enable.idempotence"] is True
    with pytest.raises(ConfigurationError, match="latency_producers"):
        Sizes(latency_producers=("transactional",))


def test_kinbox_is_started_as_a_user_starts_it_and_the_shell_cannot_tune_it() -> None:
    spec = ChildSpec(
        "kinbox-each", "unused", "b:9092", "postgresql://h/db", "g", "t", "s", "e",
        kafka={"security.protocol": "SSL"},
    )  # fmt: skip
    argv = deploy.worker_argv("m:each", spec)
    assert argv[-8:] == [
        "worker", "m:each", "--bootstrap-servers", "b:9092", "--database-url",
        "postgresql://h/db", "-X", "security.protocol=SSL",
    ]  # fmt: skip
    shell = {"PATH": "/bin", "KINBOX_BATCH_MAX_WAIT": "5", "KINBOX_FAILPOINTS": "x=kill@1"}
    assert deploy.untuned(shell) == {"PATH": "/bin", "KINBOX_FAILPOINTS": "x=kill@1"}


class _StartingProducer:
    """A producer whose id comes with its n-th poll (never, for None); it knows every topic."""

    def __init__(self, assigned: threading.Event, polls_before_id: int | None) -> None:
        self.assigned, self.left, self.polls = assigned, polls_before_id, 0
        self.asked: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> None:
        self.asked.append(topic)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        if self.left is not None:
            self.left -= 1
            if self.left <= 0:
                self.assigned.set()
        return 0


def test_the_feeders_clock_starts_once_its_producer_has_its_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assigned = threading.Event()
    producer = _StartingProducer(assigned, polls_before_id=3)
    feeder._ready(producer, "t", assigned)  # type: ignore[arg-type]
    assert producer.asked == ["t"] and producer.polls == 3 and assigned.is_set()
    # A plain producer needs only the topic's metadata
    ready = threading.Event()
    ready.set()
    plain = _StartingProducer(ready, polls_before_id=None)
    feeder._ready(plain, "t", ready)  # type: ignore[arg-type]
    assert plain.asked == ["t"] and plain.polls == 0
    # A producer that never gets its id fails the run rather than feeding late
    monkeypatch.setattr(feeder, "READY_WAIT", 0.05)
    never = threading.Event()
    with pytest.raises(TimeoutError, match="producer id"):
        feeder._ready(_StartingProducer(never, polls_before_id=None), "t", never)  # type: ignore[arg-type]


def test_a_window_the_broker_held_up_shows_from_produce_but_not_from_the_append(
    tmp_path: Path,
) -> None:
    # Given 20 s at 10 events/s, each committed 5 ms after the broker's append, but the
    # records produced in the first second appended 100 ms late (the broker's first seconds)
    rows, acks = [], []
    for n in range(200):
        sent = 1000.0 + n / 10
        append = sent + (0.100 if n < 10 else 0.001)
        rows.append(effects.Timed(0, n, sent, append + 0.004, append + 0.005))
        acks.append(f"0 {n} {append:.6f}\n")
    (tmp_path / "acks").write_text("".join(acks))
    result = RunResult("latency-1000-plain", "kinbox-each", 0)
    # When the run's latencies are taken
    outside._latencies(
        result, rows, tmp_path / "acks", tmp_path / "no-stamps", "t", Sizes(stage_every=0)
    )
    # Then the first window is the worst from produce, and no worse than the rest from the append
    notes = result.notes
    assert notes["worst_window_p99_ms"] == pytest.approx(105.0)
    assert notes["worst_window_from_append_p99_ms"] == pytest.approx(5.0)
    assert notes["from_append_p99_ms"] == pytest.approx(5.0)
