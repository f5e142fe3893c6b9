"""Failpoints: named places where a crash test can make the worker die.

``KINBOX_FAILPOINTS="after_db_commit=kill@3,before_db_commit=kill@1"`` makes
the process SIGKILL itself on the 3rd time it reaches ``after_db_commit`` (the
database transaction committed, its Kafka offset not yet) and so on. A real
SIGKILL, not an exception: no ``finally``, no consumer close, no commit — the
same as a power cut, which is what the tests must survive.

Unset, :func:`failpoint` is one dict lookup on an empty dict.
"""

from __future__ import annotations

import os
import signal

from kinbox.errors import ConfigurationError

ENV = "KINBOX_FAILPOINTS"
_ACTIONS = ("kill",)

_plan: dict[str, int] = {}
_hits: dict[str, int] = {}


def configure(spec: str | None) -> None:
    """Arm failpoints from a spec like ``"name=kill@N,..."`` (``None``/empty disarms).

    Raises:
        ConfigurationError: the spec does not parse.
    """
    _plan.clear()
    _hits.clear()
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        name, _, rest = item.partition("=")
        action, _, nth = rest.partition("@")
        if not name or action not in _ACTIONS or not nth.isdigit() or int(nth) < 1:
            raise ConfigurationError(
                f"{ENV} item {item!r} is not allowed: use name=kill@N with N >= 1"
            )
        _plan[name] = int(nth)


def failpoint(name: str) -> None:
    """Count a pass through ``name``; SIGKILL this process on the armed hit."""
    if not _plan or name not in _plan:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == _plan[name]:
        os.kill(os.getpid(), signal.SIGKILL)


configure(os.environ.get(ENV))
