"""Latencies over a run and window by window: how steady a contender is, not only how fast.

A deployment's dashboard shows percentiles per interval, so a run's p99 over
minutes hides what a team sees: a bad ten seconds. :func:`windows` cuts a
run's samples by when each event was produced into windows of fixed length
and gives each its percentiles; :func:`spread` sums the run up, with the
worst window beside the whole run's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kinbox.bench.results import percentiles


@dataclass(frozen=True)
class Window:
    """One window of a run: its start (seconds after the run's first event) and its figures."""

    start_s: float
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class Spread:
    """A run's latency: over the whole run, and per window."""

    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    window_s: float
    windows: tuple[Window, ...]

    @property
    def worst_p99_ms(self) -> float:
        """The highest p99 of any window."""
        return max((w.p99_ms for w in self.windows), default=self.p99_ms)

    @property
    def worst_vs_run(self) -> float:
        """The worst window's p99 over the whole run's (the target: at most 2)."""
        return self.worst_p99_ms / self.p99_ms if self.p99_ms > 0 else 0.0

    def as_notes(self) -> dict[str, Any]:
        """For a run's notes (JSON)."""
        return {
            "max_ms": round(self.max_ms, 2),
            "window_s": self.window_s,
            "worst_window_p99_ms": round(self.worst_p99_ms, 2),
            "worst_window_vs_run_p99": round(self.worst_vs_run, 2),
            "windows": [
                {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(w).items()}
                for w in self.windows
            ],
        }


MIN_WINDOW_SAMPLES = 2
"""A window with fewer samples (the run's tail end) has no percentile and is left out."""


def windows(
    samples: Sequence[tuple[float, float]], window_s: float, origin: float | None = None
) -> list[Window]:
    """Per window of ``window_s`` seconds: the percentiles of the latencies produced in it.

    Args:
        samples: ``(produced at, latency ms)`` pairs, in any order.
        window_s: the windows' length.
        origin: when the first window starts (default: the first sample).
    """
    if not samples:
        return []
    start = min(t for t, _ in samples) if origin is None else origin
    cut: dict[int, list[float]] = {}
    for produced, latency in samples:
        cut.setdefault(int((produced - start) // window_s), []).append(latency)
    out = []
    for index in sorted(cut):
        values = cut[index]
        if len(values) < MIN_WINDOW_SAMPLES:
            continue
        p50, p99 = percentiles(values)
        out.append(Window(index * window_s, len(values), p50, p99, max(values)))
    return out


def spread(samples: Sequence[tuple[float, float]], window_s: float) -> Spread:
    """The whole run's percentiles and its windows' (at least two samples).

    Raises:
        ValueError: fewer than two samples.
    """
    if len(samples) < 2:
        raise ValueError(f"a latency needs two samples at least, got {len(samples)}")
    values = [latency for _, latency in samples]
    p50, p99 = percentiles(values)
    return Spread(len(values), p50, p99, max(values), window_s, tuple(windows(samples, window_s)))
