"""Handler calls held open on purpose (``FAULT_SLOW_IDS`` with a gate), for the overlap scenarios.

A worker started with :func:`held_env` holds the handler call of each id
in ``held`` inside its transaction until the round touches its gate file,
so a fault can land while those batches are in flight (scenarios 26, 27).
"""

from __future__ import annotations

from tests.support.fault_run import Run
from tests.support.waiting import wait_for


def held_env(run: Run, held: list[str], sleep: float = 0.002) -> dict[str, str]:
    """A worker's environment: ``sleep`` s an event, the calls of ``held`` held at the gate."""
    return {
        "KINBOX_POOL_SIZE": "3",  # every partition its own batch at once
        "FAULT_SLEEP": str(sleep),
        "FAULT_SLOW_IDS": ",".join(held),
        "FAULT_SLOW_SECONDS": "40",  # a safety net: the gate opens, or the process dies, first
        "FAULT_GATE": str(run.log_dir / "gate"),
    }


def holds_of(run: Run, pid: int) -> tuple[set[str], set[str]]:
    """The ids whose held call ``pid`` began, and those whose held call it ended."""
    path = run.log_dir / f"deliveries-{pid}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    marks = [line.split() for line in lines if line.startswith("w ")]
    return {m[3] for m in marks if m[4] == "begin"}, {m[3] for m in marks if m[4] == "end"}


def wait_holding(run: Run, held: list[str], pid: int) -> None:
    """Wait until ``pid`` holds a call of every id in ``held``."""
    wait_for(lambda: holds_of(run, pid)[0] == set(held), 60, f"holds of {held}")
    holding(run, held, pid)


def holding(run: Run, held: list[str], pid: int) -> None:
    """Assert that ``pid``'s held calls all began and none has ended."""
    began, ended = holds_of(run, pid)
    assert began == set(held) and not ended, (began, ended)
