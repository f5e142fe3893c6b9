"""CPU time of a process and its descendants, read from ``/proc`` (Linux; elsewhere: unknown).

The outside scenarios report what an event costs the consumer's process as a
team would see it in its dashboard: the process's CPU time (user and system,
every thread) over the run, divided by the events. Children count too (the
live ones, and those it has waited for), so a worker started with
``--processes N`` is counted whole.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


TICKS = _ticks()
"""Clock ticks a second, the unit of ``/proc/<pid>/stat``'s times."""


def _stat(pid: int, proc: Path) -> tuple[int, float] | None:
    """``(parent pid, CPU seconds of the process and its waited-for children)``."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after it.
    fields = text[text.rindex(")") + 2 :].split()
    # After the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15), 0-based here.
    return int(fields[1]), sum(int(v) for v in fields[11:15]) / TICKS


def cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """CPU seconds used so far by ``pid`` and its descendants; ``None`` if gone or unknown."""
    own = _stat(pid, proc)
    if own is None:
        return None
    total = own[1]
    children: dict[int, list[int]] = {}
    try:
        entries = [int(e.name) for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return total
    seconds: dict[int, float] = {}
    for entry in entries:
        found = _stat(entry, proc)
        if found is not None:
            children.setdefault(found[0], []).append(entry)
            seconds[entry] = found[1]
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        total += seconds.get(child, 0.0)
        todo += children.get(child, ())
    return total
