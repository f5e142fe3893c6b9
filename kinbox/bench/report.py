"""The report: a header of versions, the markdown tables, JSON for machines, a PNG chart.

The headline ratios are the figures the benchmark page quotes; each is
a ratio of two figures from the *same* run, because on a shared, noisy
machine absolute rates drift and ratios hold.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import confluent_kafka
import psycopg
from psycopg import sql

from kinbox.bench import outside_report, slowkeys
from kinbox.bench.contenders import BY_NAME as CONTENDERS
from kinbox.bench.harness import BenchResult
from kinbox.bench.results import Summary, find, summarise
from kinbox.bench.scenarios import TITLES, title
from kinbox.bench.spec import Sizes, Target
from kinbox.core.errors import KinboxError

OUTBOX_LABELS = {
    "relay": "outbox relay",
    "relay-backlog": "outbox relay, backlog (one relay)",
    "relay-notify": "outbox COMMIT → consumer, LISTEN/NOTIFY",
    "relay-sql": "outbox COMMIT → consumer, rows written by SQL at a steady rate",
    "relay-polling": "outbox COMMIT → consumer, polling only (1 s; trigger disabled)",
    "trigger": "outbox NOTIFY trigger's cost per INSERT (notes)",
    "debezium": "outbox via Debezium (CDC)",
    "debezium-backlog": "outbox via Debezium, backlog (one connector task)",
    "debezium-latency": "outbox COMMIT → consumer, Debezium",
}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def header(target: Target, sizes: Sizes) -> dict[str, Any]:
    """Versions and settings of everything measured."""
    with psycopg.connect(target.database_url, autocommit=True) as conn:

        def show(name: str) -> str:
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            return str(row[0]) if row else "?"

        postgres = {
            "version": show("server_version"), "fsync": show("fsync"),
            "synchronous_commit": show("synchronous_commit"),
            "track_commit_timestamp": show("track_commit_timestamp"),
            "shared_buffers": show("shared_buffers"),
        }  # fmt: skip
    return {
        "kafka": target.kafka_version or "not given (--kafka-version)",
        "kafka_connect": _connect_versions(target),
        "postgresql": postgres,
        "librdkafka": confluent_kafka.libversion()[0],
        "confluent_kafka": _version("confluent-kafka"),
        "python": platform.python_version(),
        "kinbox": _version("kinbox"),
        "faststream": _version("faststream"),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "sizes": sizes.__dict__,
    }


def _connect_versions(target: Target) -> str | None:
    """``Kafka Connect <v>, Debezium <v>`` of the CDC contender's worker, if there is one."""
    if not target.connect_url:
        return None
    from producer_outbox.connect_api import ConnectClient
    from producer_outbox.debezium import CONNECTOR_CLASS

    try:
        client = ConnectClient(target.connect_url)
        debezium = client.plugins().get(CONNECTOR_CLASS, "not installed")
        return f"Kafka Connect {client.version()}, Debezium {debezium}"
    except KinboxError as exc:
        return f"unknown ({exc})"


def headline(summaries: Sequence[Summary]) -> dict[str, float | None]:
    """The ratios and figures a performance issue tracks, all from this one run."""

    def rate(scenario: str, contender: str) -> float | None:
        found = find(summaries, scenario, contender)
        return found.rate if found is not None and found.comparable else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def get(scenario: str, contender: str, attr: str) -> Any:
        found = find(summaries, scenario, contender)
        return getattr(found, attr) if found is not None and found.ok else None

    def note(scenario: str, contender: str, key: str) -> Any:
        found = find(summaries, scenario, contender)
        return found.notes.get(key) if found is not None and found.ok else None

    rss = [s.peak_rss for s in summaries if s.ok and s.contender.startswith("kinbox")]
    return {
        "batch_vs_ceiling": ratio(rate("clean", "kinbox-batch"), rate("clean", "ceiling")),
        "each_vs_ceiling": ratio(rate("clean", "kinbox-each"), rate("clean", "ceiling")),
        "each_vs_faststream": ratio(rate("clean", "kinbox-each"), rate("clean", "faststream")),
        "batch_replay_vs_clean": ratio(
            rate("replay", "kinbox-batch"), rate("clean", "kinbox-batch")
        ),
        "each_replay_vs_clean": ratio(rate("replay", "kinbox-each"), rate("clean", "kinbox-each")),
        "batch_large_vs_empty": ratio(rate("large", "kinbox-batch"), rate("empty", "kinbox-batch")),
        "each_large_vs_empty": ratio(rate("large", "kinbox-each"), rate("empty", "kinbox-each")),
        "relay_backlog_rows_per_s": rate("outbox", "relay-backlog"),
        "relay_backlog_with_startup_rows_per_s": note(
            "outbox", "relay-backlog", "rate_with_startup"
        ),
        "relay_backlog_cpu_us_per_row": note("outbox", "relay-backlog", "cpu_us_per_row"),
        "relay_backlog_busy_pct": note("outbox", "relay-backlog", "busy_pct"),
        "relay_sql_p50_ms": get("outbox", "relay-sql", "p50_ms"),
        "relay_sql_p99_ms": get("outbox", "relay-sql", "p99_ms"),
        "trigger_single_insert_added_us": note("outbox", "trigger", "single_added_us"),
        "trigger_100_row_insert_added_us": note("outbox", "trigger", "multi100_added_us"),
        "notify_p50_ms": get("outbox", "relay-notify", "p50_ms"),
        "notify_p99_ms": get("outbox", "relay-notify", "p99_ms"),
        "debezium_backlog_rows_per_s": rate("outbox", "debezium-backlog"),
        "debezium_vs_relay_backlog": ratio(
            rate("outbox", "debezium-backlog"), rate("outbox", "relay-backlog")
        ),
        "debezium_p50_ms": get("outbox", "debezium-latency", "p50_ms"),
        "debezium_p99_ms": get("outbox", "debezium-latency", "p99_ms"),
        "worker_peak_rss_mb_memory": _mb(max(
            (s.peak_rss for s in summaries if s.ok and s.scenario == "memory"
             and s.contender.startswith("kinbox")), default=0)),
        "worker_peak_rss_mb_any": _mb(max(rss, default=0)),
        "relay_peak_rss_mb": _mb(get("outbox", "relay-backlog", "peak_rss") or 0),
        **outside_report.headline(summaries),
        **slowkeys.headline(summaries),
    }  # fmt: skip


def _mb(value: int) -> float | None:
    return round(value / 2**20, 1) if value else None


def to_json(target: Target, sizes: Sizes, outcome: BenchResult) -> dict[str, Any]:
    """Everything, for machines."""
    summaries = summarise(outcome.results)
    return {
        "header": header(target, sizes),
        "headline": headline(summaries),
        "summaries": [s.as_dict() for s in summaries],
        "runs": [r.__dict__ for r in outcome.results],
        "skipped": outcome.skipped,
        "notes": outcome.notes,
    }


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _label(contender: str) -> str:
    if contender in OUTBOX_LABELS:
        return OUTBOX_LABELS[contender]
    found = CONTENDERS.get(contender)
    return found.label if found else contender


def _rate_cell(s: Summary) -> str:
    if not s.ok:
        return "**FAILED**"
    if s.duplicates_applied:
        return f"✗ {s.duplicates_applied:,} duplicates applied"
    if s.rate is None:
        return "-"
    spread = ""
    if s.runs > 1 and s.rate_min is not None and s.rate_max is not None:
        spread = f" ({s.rate_min:,.0f}-{s.rate_max:,.0f})"
    return f"{s.rate:,.0f}{spread}"


def markdown(data: dict[str, Any], outcome: BenchResult) -> str:
    """The header, the main table, the headline ratios, the failures."""
    h = data["header"]
    pg = h["postgresql"]
    lines = [
        f"Kafka {h['kafka']} · PostgreSQL {pg['version']} (fsync={pg['fsync']}, "
        f"synchronous_commit={pg['synchronous_commit']}) · librdkafka {h['librdkafka']} · "
        f"confluent-kafka {h['confluent_kafka']} · Python {h['python']} · "
        f"FastStream {h['faststream']} · {h['cores']} cores"
        + (f" · {h['kafka_connect']}" if h.get("kafka_connect") else ""),
        "",
        "| scenario | contender | events/s (median, min-max) | x article | x ceiling "
        "| p50 / p99 ms | duplicates suppressed | effects applied | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summarise(outcome.results):
        scenario = title(s.scenario)
        latency = "-" if s.p50_ms is None else f"{s.p50_ms:.1f} / {_num(s.p99_ms, 1)}"
        lines.append(
            f"| {scenario} | {_label(s.contender)} | {_rate_cell(s)} | {_ratio(s.vs_article)} "
            f"| {_ratio(s.vs_ceiling)} | {latency} | {s.duplicates_suppressed:,} "
            f"| {s.effects:,} | {_num(_mb(s.peak_rss), 0) if s.peak_rss else '-'} |"
        )
    lines += ["", "| headline (same run) | value |", "|---|---:|"]
    for key, value in data["headline"].items():
        shown = _ratio(value) if "_vs_" in key else _num(value, 1)
        lines.append(f"| {key} | {shown} |")
    lines += outside_report.markdown(summarise(outcome.results), _label)
    failures = [r for r in outcome.results if not r.ok]
    if failures:
        lines += ["", "**FAILED runs (no figure is reported for them):**", ""]
        lines += [f"- {r.scenario} · {r.contender} · rep {r.rep + 1}: {r.error}" for r in failures]
    if outcome.skipped:
        lines += ["", "Skipped: " + "; ".join(outcome.skipped)]
    return "\n".join(lines) + "\n"


def chart(data: dict[str, Any], path: Path) -> bool:
    """Bars of events/s per scenario and contender (log scale).

    Returns ``False`` (and draws nothing) without matplotlib or without a timed run.
    """
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return False
    rows = [s for s in data["summaries"] if s["comparable"] and s["contender"] in CONTENDERS]
    if not rows:
        return False  # nothing was timed (the quick mode): no chart rather than an empty one
    scenarios = [n for n in TITLES if any(s["scenario"] == n for s in rows)]
    names = [c for c in CONTENDERS if any(s["contender"] == c for s in rows)]
    fig, ax = plt.subplots(figsize=(12, 5.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, scenario in enumerate(scenarios):
            for s in rows:
                if s["scenario"] == scenario and s["contender"] == name:
                    xs.append(j + i * width)
                    ys.append(s["rate"])
                    lo.append(s["rate"] - (s["rate_min"] or s["rate"]))
                    hi.append((s["rate_max"] or s["rate"]) - s["rate"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=_label(name))
    ax.set_yscale("log")
    ax.set_ylabel("events/s (log scale; bars: median, whiskers: min-max)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(scenarios))])
    ax.set_xticklabels([TITLES[n] for n in scenarios], rotation=20, ha="right")
    h = data["header"]
    ax.set_title(
        f"kinbox bench — Kafka {h['kafka']}, PostgreSQL {h['postgresql']['version']} "
        f"(fsync={h['postgresql']['fsync']}), {h['cores']} cores"
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(data: dict[str, Any], outcome: BenchResult, out_dir: Path) -> list[Path]:
    """Write ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "bench.json", out_dir / "bench.md"]
    written[0].write_text(json.dumps(data, indent=2, default=str) + "\n")
    written[1].write_text(markdown(data, outcome))
    if chart(data, out_dir / "bench.png"):
        written.append(out_dir / "bench.png")
    return written
