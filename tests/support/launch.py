"""How the tests launch kinbox: the command line, and the short timings every test member uses.

Kafka's defaults keep a dead member in its group for 45 s and back off for
seconds; tests kill members on purpose and must see the group move on in a
few. These are the one source of those timings, whether a test runs
``kinbox worker`` as a process (:func:`timing_env`, :func:`worker_argv`) or a
runner in a thread (``Settings(**FAST_TIMINGS, ...)``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the working directory of every process the tests start."""


class Timings(TypedDict, total=False):
    """The :class:`kinbox.core.config.Settings` fields that decide how fast a group reacts."""

    session_timeout: float
    max_poll_interval: float
    retry_initial: float
    retry_max: float
    shutdown_timeout: float


FAST_TIMINGS: Timings = {
    "session_timeout": 6,  # a SIGKILLed member leaves the group in seconds, not 45
    "max_poll_interval": 30,
    "retry_initial": 0.1,
    "retry_max": 1,
}

FAST_GROUP: Mapping[str, str] = {
    "heartbeat.interval.ms": "500",
    "topic.metadata.refresh.interval.ms": "2000",
}
"""``-X`` properties of every test member: heartbeats and metadata at the pace of the timeout."""

FAST_KAFKA: Mapping[str, str] = {**FAST_GROUP, "reconnect.backoff.max.ms": "1000"}
""":data:`FAST_GROUP`, and a broker that comes back is found within a second (fault suite)."""

PROTOCOLS: Mapping[str, Mapping[str, str | None]] = {
    "eager": {"partition.assignment.strategy": "range"},
    "cooperative": {},  # kinbox's default: cooperative-sticky
    # KIP-848: the broker owns the heartbeat interval; librdkafka refuses the client's.
    "kip848": {"group.protocol": "consumer", "heartbeat.interval.ms": None},
}
"""``-X`` properties over :data:`FAST_KAFKA` per group assignment protocol, by the fault
suite's case names. Under KIP-848 the session timeout is the broker's
(``group.consumer.session.timeout.ms``, :mod:`kinbox.devstack.kafka`), not the client's."""


def timing_env(timings: Timings = FAST_TIMINGS) -> dict[str, str]:
    """The ``KINBOX_<SETTING>`` variables that give a ``kinbox worker`` these ``timings``."""
    return {f"KINBOX_{name.upper()}": f"{value:g}" for name, value in timings.items()}


def kafka_flags(properties: Mapping[str, str | None]) -> list[str]:
    """``-X key=value`` options; a ``None`` value leaves its key out (KIP-848 refuses some)."""
    flags: list[str] = []
    for key, value in properties.items():
        if value is not None:
            flags += ["-X", f"{key}={value}"]
    return flags


def worker_argv(
    app: str, options: Sequence[str] = (), kafka: Mapping[str, str | None] = FAST_GROUP
) -> list[str]:
    """The command line of ``kinbox worker <app> <options> -X ...`` under this interpreter."""
    return [sys.executable, "-m", "kinbox", "worker", app, *options, *kafka_flags(kafka)]
