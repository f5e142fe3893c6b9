"""Fault injection for the crash tests: ``KINBOX_FAILPOINTS="name=action@n,..."``.

The same tiny format as :mod:`kinbox`'s worker, parsed here so the outbox never
imports consumer code. ``action`` is ``kill`` (SIGKILL this process: no
cleanup, no COMMIT, like a power cut) or ``raise`` (:class:`FailpointError`);
``@n`` fires on the n-th time the point is reached (default 1). Unset, a
failpoint is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Mapping

from kinbox.errors import ConfigurationError, KinboxError

ENV = "KINBOX_FAILPOINTS"
_ACTIONS = ("kill", "raise")


class FailpointError(KinboxError):
    """Raised by a failpoint whose action is ``raise``."""


def parse(spec: str) -> dict[str, tuple[str, int]]:
    """Parse ``"name=action@n,..."`` into ``{name: (action, n)}``.

    Raises:
        ConfigurationError: naming the bad entry and the allowed form.
    """
    points: dict[str, tuple[str, int]] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, rule = entry.partition("=")
        action, _, count = rule.partition("@")
        if not name or action not in _ACTIONS or (count and not count.isdigit()):
            raise ConfigurationError(
                f"{ENV} entry {entry!r} is not allowed: use name=kill|raise[@n]"
            )
        points[name.strip()] = (action, int(count) if count else 1)
    return points


class Failpoints:
    """Failpoints read once from the environment; ``hit(name)`` at each point."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._points = parse((os.environ if environ is None else environ).get(ENV, ""))
        self._hits: Counter[str] = Counter()

    def hit(self, name: str) -> None:
        """Count a pass through ``name``; act when its count is reached."""
        if name not in self._points:
            return
        action, count = self._points[name]
        self._hits[name] += 1
        if self._hits[name] != count:
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise FailpointError(f"failpoint {name!r} fired on pass {count}")
