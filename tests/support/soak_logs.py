"""Reading the soak's worker logs: checks over them, excerpts, and what a failure looks like.

Each member logs to ``<name>.log`` in the round's log directory (the
``kinbox worker`` text format: ``time LEVEL [pid] logger: message``).
:data:`LOG_CHECKS` are checks of the soak made over those lines;
:func:`excerpt` gives the lines about one partition, merged in time order;
:data:`DIAGNOSES` name what a failure looks like when its mark is in the logs
or the findings, so a report can say so.
"""

from __future__ import annotations

import re
from pathlib import Path

LOG_CHECKS: dict[str, str] = {
    # The soak never takes the database down: an outage blamed on a statement
    # PostgreSQL refused for its content is a handler's failure misjudged
    # (docs/design.md invariant 5), even where the partition got past it later.
    "a handler's refused statement taken for an outage": (
        r"store failure at .*(PipelineAborted|InFailedSqlTransaction|DivisionByZero"
        r"|InvalidTextRepresentation)"
    ),
    "a thread of a worker died": r"Exception in thread",
}
"""Checks over the members' logs: each matching line is one failure."""

DIAGNOSES: tuple[tuple[str, str], ...] = (
    ("a database error the handler caught without a savepoint, retried as an outage "
     "(a store failure: the partition never moves on)",
     r"store failure at .*(InFailedSqlTransaction|PipelineAborted|aborted)"),
    ("a member stopped by SIGTERM that does not exit (a shutdown that hangs)",
     r"still running \d+s after SIGTERM"),
    ("an offset committed past a record not yet applied (a commit racing a batch, "
     "on a revoke or a loss)", r"is not in processed_events"),
)  # fmt: skip
"""What a failure looks like: (what it is, a regex over the worker logs and the findings)."""

EXCERPT_LINES = 25


_VARYING = re.compile(r"^\S+ \S+ |in [\d.]+s|attempt \d+")
"""What differs between two tries of one failure in a log line: the time, the delay, the try."""


def member_logs(log_dir: Path) -> list[Path]:
    """The members' own logs (their stderr), not the soak's other files."""
    others = {"producer", "churn"}
    return [p for p in sorted(log_dir.glob("*.log"))
            if p.stem not in others and not p.stem.startswith("batches-")]  # fmt: skip


def excerpt(log_dir: Path, topic: str, partition: int) -> list[str]:
    """The members' log lines about ``topic[partition]``, in time order, each with its member.

    A run of lines that differ only in time, delay and try (a partition
    retrying) is shown once, with how often it came; the first and the last
    lines are kept when there are too many.
    """
    marks = (f"{topic}[{partition}]", f"('{topic}', {partition})")
    found: list[tuple[str, str, str]] = []
    for path in member_logs(log_dir):
        with path.open(errors="replace") as lines:
            for line in lines:
                if any(mark in line for mark in marks):
                    text = f"{path.stem}: {line.rstrip()[:400]}"
                    found.append((line[:23], f"{path.stem} {shape(line)}", text))
    found.sort(key=lambda item: item[0])
    out = collapse([(shape, text) for _, shape, text in found])
    if len(out) > EXCERPT_LINES:
        head = EXCERPT_LINES // 3
        cut = len(out) - EXCERPT_LINES
        out = [*out[:head], f"[{cut} lines left out]", *out[-(EXCERPT_LINES - head) :]]
    return out


def collapse(lines: list[tuple[str, str]]) -> list[str]:
    """``(shape, text)`` lines, a run of one shape shown once with how often it came."""
    runs: list[list[str]] = []
    last = None
    for shape, text in lines:
        if shape == last:
            runs[-1].append(text)
        else:
            runs.append([text])
        last = shape
    return [run[0] + (f"  [and {len(run) - 1} more like it, the last at {_time(run[-1])}]"
                      if len(run) > 1 else "") for run in runs]  # fmt: skip


def shape(line: str) -> str:
    """A log line without what differs between two tries of one failure."""
    return _VARYING.sub("", line)


def _time(text: str) -> str:
    found = re.search(r"\d\d:\d\d:\d\d,\d+", text)
    return found.group(0) if found else "?"


def diagnoses(log_dir: Path, findings: list[str]) -> list[str]:
    """Which :data:`DIAGNOSES` the logs or the findings show, each with one line as evidence."""
    texts = [line for finding in findings for line in finding.splitlines()]
    hits = []
    for what, pattern in DIAGNOSES:
        regex = re.compile(pattern)
        evidence = next((t.strip() for t in texts if regex.search(t)), None)
        if evidence is None:
            for path in member_logs(log_dir):
                with path.open(errors="replace") as lines:
                    evidence = next((f"{path.stem}: {line.strip()[:300]}"
                                     for line in lines if regex.search(line)), None)  # fmt: skip
                if evidence is not None:
                    break
        if evidence is not None:
            hits.append(f"looks like {what}\n      e.g. {evidence[:300]}")
    return hits


def grep(log_dir: Path, pattern: str) -> list[str]:
    """The members' log lines matching ``pattern``, each with its member's name."""
    regex = re.compile(pattern)
    found = []
    for path in member_logs(log_dir):
        with path.open(errors="replace") as lines:
            found += [f"{path.stem}: {line.strip()[:300]}" for line in lines if regex.search(line)]
    return found
