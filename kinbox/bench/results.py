"""Results: one per run, summarised per scenario and contender (median and spread).

A run that failed its check keeps its reason and nothing else: its summary
says FAILED and carries no figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kinbox.bench.contenders import ARTICLE, CEILING, HAND

BASELINE = {"drain": HAND}
"""The contender a scenario's ``vs_ceiling`` divides by, where it is not the ceiling."""

UNTIMED = "untimed"
"""A note saying why a run that passed its check has no figure (its scenario did not happen)."""


@dataclass
class RunResult:
    """What one run of one contender in one scenario measured."""

    scenario: str
    contender: str
    rep: int
    ok: bool = True
    error: str | None = None
    records: int = 0
    """Records consumed to the end of the topic (producer duplicates included)."""
    distinct: int = 0
    """Distinct events among them: what must be applied."""
    effects: int = 0
    """Effect rows written."""
    duplicates_applied: int = 0
    duplicates_suppressed: int = 0
    rate: float | None = None
    """Records per second (rows/s for the relay); ``None``: too short to time."""
    p50_ms: float | None = None
    p99_ms: float | None = None
    latency_method: str | None = None
    peak_rss: int = 0
    """Bytes; the highest of the run's consumer processes."""
    kills: int = 0
    seconds: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def failed(self, error: str) -> RunResult:
        """Mark this run failed: its figures are dropped."""
        return RunResult(self.scenario, self.contender, self.rep, ok=False, error=error)


@dataclass(frozen=True)
class Summary:
    """One contender in one scenario over its repetitions."""

    scenario: str
    contender: str
    runs: int
    failures: tuple[str, ...]
    rate: float | None = None
    rate_min: float | None = None
    rate_max: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    latency_method: str | None = None
    duplicates_suppressed: int = 0
    duplicates_applied: int = 0
    effects: int = 0
    records: int = 0
    peak_rss: int = 0
    kills: int = 0
    vs_article: float | None = None
    vs_ceiling: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No run failed."""
        return not self.failures

    @property
    def comparable(self) -> bool:
        """A throughput figure that may stand beside the others (no duplicate was applied)."""
        return self.ok and self.rate is not None and not self.duplicates_applied

    def as_dict(self) -> dict[str, Any]:
        """For JSON."""
        return {**asdict(self), "ok": self.ok, "comparable": self.comparable}


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """The median and the 99th percentile of ``values`` (at least two), as every latency reports.

    Inclusive quantiles: with few samples the p99 lies between the two slowest,
    never beyond the slowest.
    """
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _notes(group: Sequence[RunResult]) -> dict[str, Any]:
    """The last run's notes, but a measured figure among them is the median, as p50/p99 are.

    Measured: a latency (``*_ms``) or a share of the machine (``*_pct``).
    """
    notes = dict(group[-1].notes)
    for key, value in notes.items():
        if key.endswith(("_ms", "_pct")) and isinstance(value, float | int):
            notes[key] = _median([r.notes.get(key) for r in group])
    return notes


def summarise(runs: Sequence[RunResult]) -> list[Summary]:
    """One :class:`Summary` per (scenario, contender), in first-seen order, with ratios."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.scenario, run.contender), []).append(run)
    out = []
    for (scenario, contender), group in groups.items():
        failures = tuple(f"rep {r.rep}: {r.error}" for r in group if not r.ok)
        if failures:
            out.append(Summary(scenario, contender, len(group), failures))
            continue
        rates = [r.rate for r in group if r.rate is not None]
        last = group[-1]
        out.append(
            Summary(
                scenario, contender, len(group), (),
                rate=_median(rates), rate_min=min(rates, default=None),
                rate_max=max(rates, default=None),
                p50_ms=_median([r.p50_ms for r in group]),
                p99_ms=_median([r.p99_ms for r in group]),
                latency_method=last.latency_method,
                duplicates_suppressed=last.duplicates_suppressed,
                duplicates_applied=max(r.duplicates_applied for r in group),
                effects=last.effects, records=last.records,
                peak_rss=max(r.peak_rss for r in group), kills=last.kills, notes=_notes(group),
            )
        )  # fmt: skip
    return _with_ratios(out)


def _with_ratios(summaries: list[Summary]) -> list[Summary]:
    base = {(s.scenario, s.contender): s.rate for s in summaries if s.comparable}
    out = []
    for s in summaries:
        if not s.comparable or s.rate is None:
            out.append(s)
            continue
        article = base.get((s.scenario, ARTICLE))
        ceiling = base.get((s.scenario, BASELINE.get(s.scenario, CEILING)))
        out.append(
            Summary(**{
                **{k: getattr(s, k) for k in s.__dataclass_fields__},
                "vs_article": s.rate / article if article else None,
                "vs_ceiling": s.rate / ceiling if ceiling else None,
            })
        )  # fmt: skip
    return out


def find(summaries: Sequence[Summary], scenario: str, contender: str) -> Summary | None:
    """The summary of ``contender`` in ``scenario``, if it ran."""
    for s in summaries:
        if s.scenario == scenario and s.contender == contender:
            return s
    return None
