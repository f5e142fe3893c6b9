"""The machine's own share of a latency: CPU its hypervisor took, and how late a sleeper wakes.

A latency's tail is made of waits, and on a shared virtual machine some of
them belong to no process of the run: the hypervisor runs other guests on the
cores (Linux counts it as *steal* time), and a thread that asks to sleep for
5 ms wakes later by however long the cores were elsewhere. The latency
scenario measures both over exactly its measured window, in a process of
their own (``python -m kinbox.bench.machine``, so that the harness's
producer and the probe do not share an interpreter lock), and reports them
beside the latency: a p99 in a window with a tenth of the CPU stolen and
50 ms wake-ups is the machine's figure as much as the contender's.

Steal is the host's alone. Lateness is anything that kept a core from a
thread that was ready: the host, and the run's own load on a saturated
machine (the probe competes for the cores like every other thread of the
run). Both are what any hop of the measured path paid in that window.

The probe wakes 200 times a second and does nothing else: a hundredth of a
core at most, next to the run's one and a half.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kinbox.bench.results import percentiles

log = logging.getLogger(__name__)

PERIOD = 0.005
"""How long each of the probe's sleeps asks for (seconds)."""

STAT = Path("/proc/stat")
"""Linux's CPU time counters; elsewhere steal time is not reported."""


@dataclass(frozen=True)
class Machine:
    """What the machine did during a window, beside the run's own processes."""

    steal_pct: float | None
    """Share of all CPU time the hypervisor gave to others (``None``: not Linux)."""
    late_p50_ms: float
    """Median lateness of a 5 ms sleep: how much longer than asked it took."""
    late_p99_ms: float
    late_max_ms: float
    wakes: int
    busy_pct: float | None = None
    """Share of all CPU time the machine was not idle (every process, the run's and others')."""
    load1: float | None = None
    """The one-minute load average at the window's end."""


def _ticks(stat: Path) -> list[int] | None:
    """The ``cpu`` line of ``/proc/stat``: user, nice, system, idle, iowait, irq, softirq, steal.

    The guest times after them are already in user and nice, so they are left out.
    """
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[:1] != ["cpu"] or len(first) < 9:
        return None
    return [int(v) for v in first[1:9]]


def cpu_times(stat: Path = STAT) -> tuple[int, int] | None:
    """``(steal, total)`` CPU ticks since boot, all cores, or ``None`` where unknown."""
    ticks = _ticks(stat)
    return None if ticks is None else (ticks[7], sum(ticks))


def idle_times(stat: Path = STAT) -> tuple[int, int] | None:
    """``(idle + iowait, total)`` CPU ticks since boot, all cores, or ``None`` where unknown."""
    ticks = _ticks(stat)
    return None if ticks is None else (ticks[3] + ticks[4], sum(ticks))


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Percent of the CPU time between two :func:`idle_times` that was not idle."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100 * (1 - (after[0] - before[0]) / (after[1] - before[1]))


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Percent of the CPU time between two :func:`cpu_times` that was stolen."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100 * (after[0] - before[0]) / (after[1] - before[1])


def probe(start: float, end: float, period: float = PERIOD) -> Machine:
    """Sleep ``period`` at a time from ``start`` to ``end`` (epoch seconds); measure the window."""
    delay = start - time.time()
    if delay > 0:
        time.sleep(delay)
    before, idle_before = cpu_times(), idle_times()
    late: list[float] = []
    while time.time() < end:
        asked = time.perf_counter()
        time.sleep(period)
        late.append(1000 * (time.perf_counter() - asked - period))
    after, idle_after = cpu_times(), idle_times()
    if len(late) < 2:
        late += [0.0, 0.0]  # a window shorter than two sleeps: nothing was late
    p50, p99 = percentiles(late)
    return Machine(
        steal_share(before, after), p50, p99, max(late), len(late),
        busy_share(idle_before, idle_after), _load1(),
    )  # fmt: skip


def _load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class Probe:
    """:func:`probe` of a window in a process of its own, started now.

    Args:
        start: the window's start, seconds since the epoch (the probe sleeps until then).
        end: its end.
    """

    def __init__(self, start: float, end: float) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kinbox.bench.machine", repr(start), repr(end)],
            stdout=subprocess.PIPE,
            text=True,
        )

    def result(self, timeout: float = 30.0) -> Machine | None:
        """The probe's figures once it has ended; ``None`` (and a warning) if it failed.

        The probe only explains a latency, so its failure never fails the run.
        """
        try:
            out, _ = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            log.warning("the machine probe did not end within %.0fs: no steal figures", timeout)
            return None
        if self._proc.returncode != 0:
            log.warning(
                "the machine probe failed (exit %s): no steal figures", self._proc.returncode
            )
            return None
        try:
            return Machine(**json.loads(out))
        except (ValueError, TypeError) as exc:
            log.warning("the machine probe's answer is unreadable (%s): no steal figures", exc)
            return None

    @property
    def running(self) -> bool:
        """Whether the probe's process is still there."""
        return self._proc.poll() is None

    def close(self) -> None:
        """Stop the probe if it still runs (a run that failed before reading it)."""
        if self.running:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m kinbox.bench.machine START END``: probe that window, print JSON."""
    start, end = (float(a) for a in (argv if argv is not None else sys.argv[1:]))
    print(json.dumps(asdict(probe(start, end))), flush=True)


if __name__ == "__main__":
    main()
