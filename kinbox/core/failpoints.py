"""Failpoints: named places where a crash test makes a process fail on purpose.

One grammar and one parser for every process of kinbox and producer_outbox
(worker, relay, benchmark contenders), read from ``KINBOX_FAILPOINTS`` when
this module is imported::

    spec    := [entry ("," entry)*]      blanks around parts are ignored
    entry   := name "=" action ["@" n]
    action  := "kill"    SIGKILL this process: no ``finally``, no COMMIT, no
                         consumer close — a power cut, what the tests survive
             | "raise"   raise :class:`FailpointError` at the point
             | "pause"   hold the thread at the point until the process's
                         failpoints are armed again (:func:`configure`), for
                         a test that runs kinbox in its own process and does
                         something while the thread is held (:func:`held`
                         says when); the other threads run on
    n       := 1, 2, …   act on the n-th pass through the point (default 1),
                         once; passes after it go through untouched

For example ``after_db_commit=kill@3, relay_after_publish=raise``. A name may
be armed once per spec. The names are those in :data:`NAMES`, one per call of
:func:`failpoint` in the code, so a misspelt name fails at start-up instead of
arming nothing and letting a crash test pass without a crash. A spec that does
not parse raises :class:`~kinbox.core.errors.ConfigurationError` naming the entry
and the allowed form.

Unarmed (the variable unset or empty), :func:`failpoint` costs one lookup in
an empty dict. This module imports no driver, so both packages share it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from kinbox.core.errors import ConfigurationError, KinboxError

ENV = "KINBOX_FAILPOINTS"
ACTIONS = ("kill", "raise", "pause")

NAMES: Mapping[str, str] = {
    "before_db_commit": "kinbox worker: a batch's effects written, its COMMIT not yet sent",
    "after_dead_letter_ack": (
        "kinbox worker: a batch's dead letters acknowledged by the broker, no transaction open, "
        "the one that records them not yet begun"
    ),
    "after_db_commit": (
        "kinbox worker and every benchmark contender: committed, offsets not yet committed"
    ),
    "poll_between_consumes": (
        "kinbox worker: a poll's first consume() returned records, its second not yet called"
    ),
    "relay_after_publish": "outbox relay: Kafka acknowledged a batch, its rows not yet marked sent",
    "relay_after_publish_overlapped": (
        "outbox relay: as relay_after_publish, passed only while another lane group's batch "
        "is in flight too"
    ),
}

_FORM = f"use name={'|'.join(ACTIONS)}[@n] with n >= 1"


class FailpointError(KinboxError):
    """Raised by a failpoint whose action is ``raise`` (crash tests only)."""


@dataclass(frozen=True)
class Failpoint:
    """One armed entry: do ``action`` on pass ``nth`` through ``name``."""

    name: str
    action: str
    nth: int = 1


def parse(spec: str | None) -> dict[str, Failpoint]:
    """Parse a ``KINBOX_FAILPOINTS`` spec into its armed points, by name.

    Raises:
        ConfigurationError: an entry is malformed, names an unknown point or
            action, has a count below 1, or arms a name twice.
    """
    points: dict[str, Failpoint] = {}
    for entry in filter(None, (part.strip() for part in (spec or "").split(","))):
        name, equals, rule = (part.strip() for part in entry.partition("="))
        action, at, count = (part.strip() for part in rule.partition("@"))
        if not equals or action not in ACTIONS or (at and not count.isdigit()):
            raise ConfigurationError(f"{ENV} entry {entry!r} is not allowed: {_FORM}")
        nth = int(count) if at else 1
        if nth < 1:
            raise ConfigurationError(f"{ENV} entry {entry!r} is not allowed: {_FORM}")
        if name not in NAMES:
            raise ConfigurationError(
                f"{ENV} entry {entry!r} names no failpoint: use one of {sorted(NAMES)}"
            )
        if name in points:
            raise ConfigurationError(f"{ENV} arms {name!r} twice: give each name once")
        points[name] = Failpoint(name, action, nth)
    return points


class Failpoints:
    """A set of armed failpoints and how often each was passed."""

    def __init__(self, spec: str | None = None) -> None:
        self._points: dict[str, Failpoint] = {}
        self._passes: Counter[str] = Counter()
        # Several threads pass the same points at once (a worker's batch
        # threads, the relay's lane groups): the n-th pass must be exactly one.
        self._lock = threading.Lock()
        # Set by the next arm(): what a paused thread waits for.
        self._release = threading.Event()
        self._held: Counter[str] = Counter()
        self.arm(spec)

    def arm(self, spec: str | None) -> None:
        """Replace the armed points with ``spec``'s (``None``/empty disarms) and reset counts.

        A thread held by a ``pause`` goes on (also when ``spec`` does not parse).

        Raises:
            ConfigurationError: ``spec`` does not parse (nothing is armed then).
        """
        self._points = {}  # a spec that fails to parse leaves nothing armed
        self._passes.clear()
        with self._lock:
            release, self._release = self._release, threading.Event()
        release.set()
        self._points = parse(spec)

    def held(self, name: str) -> bool:
        """Whether a thread is held at ``name`` by its ``pause`` now."""
        with self._lock:
            return self._held[name] > 0

    def hit(self, name: str) -> None:
        """Count a pass through ``name``; act if this is its armed pass.

        Raises:
            FailpointError: ``name`` is armed with ``raise`` and this is its pass.
        """
        point = self._points.get(name)
        if point is None:
            return
        with self._lock:
            self._passes[name] += 1
            passes = self._passes[name]
        if passes != point.nth:
            return
        if point.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            return  # reached only when a test stands in for os.kill
        if point.action == "pause":
            self._pause(name)
            return
        raise FailpointError(f"failpoint {name!r} fired on pass {point.nth}")

    def _pause(self, name: str) -> None:
        with self._lock:
            release = self._release
            self._held[name] += 1
        try:
            release.wait()
        finally:
            with self._lock:
                self._held[name] -= 1


# The process's failpoints: armed once from the environment the process starts with.
_process = Failpoints()


def configure(spec: str | None) -> None:
    """Re-arm this process's failpoints from ``spec`` (``None``/empty disarms).

    Raises:
        ConfigurationError: ``spec`` does not parse.
    """
    _process.arm(spec)


def held(name: str) -> bool:
    """Whether a thread of this process is held at ``name`` by its ``pause`` now."""
    return _process.held(name)


def failpoint(name: str) -> None:
    """Count a pass through ``name`` in this process; act on its armed pass.

    Raises:
        FailpointError: ``name`` is armed with ``raise`` and this is its pass.
    """
    _process.hit(name)


configure(os.environ.get(ENV))
