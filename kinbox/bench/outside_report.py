"""The outside scenarios in the report: their headline figures and their own tables.

Each latency run is one contender under one offer (``latency-<rate>-<producer>``):
its produce → committed percentiles over the run, its worst window, its CPU
per event beside the hand-written inbox's in the same run, and what the
machine did meanwhile. The stage split of kinbox's runs gets a table of its
own. The drain runs give kinbox's rate over the hand-written inbox's, and
the per-event handler's over the hand-written inbox that writes one row per
event as it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kinbox.bench.contenders import HAND, HAND_EACH
from kinbox.bench.results import Summary, find

SHORT = {"kinbox-each": "each", "kinbox-batch": "batch", HAND: "hand", HAND_EACH: "hand_each"}
"""The headline's short names of the outside contenders."""

DRAIN_PAIRS = (
    ("kinbox-each", HAND), ("kinbox-batch", HAND), (HAND_EACH, HAND), ("kinbox-each", HAND_EACH)
)  # fmt: skip
"""The drain's ratios, (contender, baseline): each over the set-based inbox, and the per-event
handler also over the hand-written inbox that writes one row per event as it does."""


def _is_latency(scenario: str) -> bool:
    return scenario.startswith("latency-")


def headline(summaries: Sequence[Summary]) -> dict[str, float | None]:
    """Per offer and contender: p50, p99, the worst windows, CPU per event (and over the hand's).

    The worst window is given from produce and from the broker's append (the consumer's part).

    Per drain contender: its rate over the hand-written inbox's, with and without start-up;
    the per-event handler's also over the hand-written inbox's per-event twin.
    """
    out: dict[str, float | None] = {}
    for s in summaries:
        short = SHORT.get(s.contender)
        if short is None or not s.ok or not _is_latency(s.scenario):
            continue
        name = s.scenario.removeprefix("latency-").replace("-", "_")
        out[f"{short}_{name}_p50_ms"] = s.p50_ms
        out[f"{short}_{name}_p99_ms"] = s.p99_ms
        out[f"{short}_{name}_worst_window_p99_ms"] = s.notes.get("worst_window_p99_ms")
        out[f"{short}_{name}_worst_window_from_append_p99_ms"] = s.notes.get(
            "worst_window_from_append_p99_ms"
        )
        cpu = s.notes.get("cpu_us_per_event")
        out[f"{short}_{name}_cpu_us_per_event"] = cpu
        hand = find(summaries, s.scenario, HAND)
        theirs = hand.notes.get("cpu_us_per_event") if hand is not None and hand.ok else None
        if s.contender != HAND:
            out[f"{short}_{name}_cpu_vs_hand"] = cpu / theirs if cpu and theirs else None
    for contender, baseline in DRAIN_PAIRS:
        mine = find(summaries, "drain", contender)
        base = find(summaries, "drain", baseline)
        if mine is None or base is None or not (mine.comparable and base.comparable):
            continue
        mine_name, base_name = SHORT[contender], SHORT[baseline]
        out[f"{mine_name}_drain_vs_{base_name}"] = _ratio(mine.rate, base.rate)
        out[f"{mine_name}_drain_with_startup_vs_{base_name}"] = _ratio(
            mine.notes.get("rate_with_startup"), base.notes.get("rate_with_startup")
        )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(summaries: Sequence[Summary], label: Any) -> list[str]:
    """The latency table (one row per offer and contender) and kinbox's stage split."""
    runs = [s for s in summaries if s.ok and _is_latency(s.scenario)]
    if not runs:
        return []
    lines = [
        "",
        "| latency, from outside | contender | p50 / p99 ms | worst window p99 ms "
        "| insert p50 / p99 ms | from append: p99 / worst window ms | CPU µs/event (cores) "
        "| machine busy % / steal % |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in runs:
        n = s.notes
        lines.append(
            f"| {s.scenario} | {label(s.contender)} | {_cell(s.p50_ms)} / {_cell(s.p99_ms)} "
            f"| {_cell(n.get('worst_window_p99_ms'))} "
            f"| {_cell(n.get('insert_p50_ms'))} / {_cell(n.get('insert_p99_ms'))} "
            f"| {_cell(n.get('from_append_p99_ms'))} / "
            f"{_cell(n.get('worst_window_from_append_p99_ms'))} "
            f"| {_cell(n.get('cpu_us_per_event'), 0)} ({_cell(n.get('cores'), 2)}) "
            f"| {_cell(n.get('busy_pct'), 0)} / {_cell(n.get('steal_pct'))} |"
        )
    staged = [s for s in runs if len(s.notes.get("stages") or ()) > 3]
    for s in staged:
        lines += [
            "",
            f"| {s.scenario} · {label(s.contender)}: stage | from | p50 / p99 ms "
            "| since produced, p50 / p99 ms |",
            "|---|---|---:|---:|",
        ]
        for leg in s.notes["stages"]:
            lines.append(
                f"| {leg['stage']} | {leg['after']} | {_cell(leg['p50_ms'], 2)} / "
                f"{_cell(leg['p99_ms'], 2)} | {_cell(leg['total_p50_ms'], 2)} / "
                f"{_cell(leg['total_p99_ms'], 2)} |"
            )
    return lines
