"""The soak's report: every check with its count, and for each failure what to debug it from.

The report of a failed round lists every check (zero or not, so a reader
sees what passed too), the first failures of each with their ids and where
they were on the topic, the lines of the members' logs about the partitions
where events were lost (merged in time order, each with its member), the
churn's findings, what the failure looks like where the logs or the
findings say (:data:`tests.support.soak_logs.DIAGNOSES`), every member and
how it ended, where the logs are, and what replays the round.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.soak_check import Result
from tests.support.soak_logs import diagnoses, excerpt


def report(title: str, result: Result, log_dir: Path, members: str, replay: str) -> str:
    """The whole report of one round (see the module docstring)."""
    out = [title, "  figures: " + ", ".join(f"{k} {v}" for k, v in result.figures.items())]
    out.append("  checks:")
    for name, (count, _) in result.failures.items():
        out.append(f"    {name:<58} {count:>6}{'   FAILED' if count else ''}")
    for name in result.failed:
        count, examples = result.failures[name]
        out.append(f"  {name} ({count}), first {len(examples)}:")
        out += [f"    {line}" for example in examples for line in example.splitlines()]
    for topic, partition in result.lost_at:
        out.append(f"  members' log lines about {topic}[{partition}], where events were lost:")
        out += [f"    {line}" for line in excerpt(log_dir, topic, partition)]
    marks = diagnoses(log_dir, [line for _, lines in result.failures.values() for line in lines])
    if result.failed and marks:
        out += [f"  {mark}" for mark in marks]
    out += ["  members:", members, f"  logs: {log_dir} (churn.log: every action)",
            f"  replay: {replay}"]  # fmt: skip
    return "\n".join(out)
