"""The machine probe: steal time from ``/proc/stat``, and a sleeper's lateness."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kinbox.bench import machine


def _stat(tmp_path: Path, cpu_line: str) -> Path:
    path = tmp_path / "stat"
    path.write_text(f"{cpu_line}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n")
    return path


def test_steal_is_its_share_of_all_cpu_time_and_guest_time_is_not_counted_twice(
    tmp_path: Path,
) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    before = machine.cpu_times(_stat(tmp_path, "cpu  100 0 50 800 10 0 10 30 7 0"))
    after = machine.cpu_times(_stat(tmp_path, "cpu  160 0 70 1100 10 0 20 70 99 0"))
    assert before == (30, 1000) and after == (70, 1430)
    assert machine.steal_share(before, after) == pytest.approx(100 * 40 / 430)


def test_without_linux_counters_there_is_no_steal_figure(tmp_path: Path) -> None:
    assert machine.cpu_times(tmp_path / "missing") is None
    assert machine.cpu_times(_stat(tmp_path, "cpu  1 2 3")) is None  # too old a kernel
    assert machine.steal_share(None, (1, 2)) is None
    assert machine.steal_share((1, 2), (1, 2)) is None  # no time passed


def test_the_probe_measures_its_window_and_nothing_before_it() -> None:
    start = time.time() + 0.1
    found = machine.probe(start, start + 0.2)
    assert time.time() >= start + 0.2
    # At most 40 sleeps of 5 ms fit in the window (fewer when they wake late).
    assert 2 <= found.wakes <= 41
    assert 0 <= found.late_p50_ms <= found.late_p99_ms <= found.late_max_ms


def test_the_probe_runs_in_a_process_of_its_own_and_hands_back_its_figures() -> None:
    start = time.time() + 0.05
    probe = machine.Probe(start, start + 0.1)
    found = probe.result(timeout=30)
    assert not probe.running
    probe.close()
    assert found is not None and found.wakes >= 2
    assert found.steal_pct is None or 0 <= found.steal_pct <= 100


def test_a_probe_that_cannot_finish_gives_no_figures_and_is_stopped() -> None:
    far = time.time() + 3600
    probe = machine.Probe(far, far + 1)
    assert probe.running
    assert probe.result(timeout=0.2) is None
    assert not probe.running
    probe.close()  # again: already stopped, nothing to do


def test_an_unreadable_answer_gives_no_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    real = subprocess.Popen

    def talking(argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        return real([sys.executable, "-c", "print('not json')"], **kw)

    monkeypatch.setattr(subprocess, "Popen", talking)
    probe = machine.Probe(time.time(), time.time())
    assert probe.result(timeout=30) is None
    probe.close()
