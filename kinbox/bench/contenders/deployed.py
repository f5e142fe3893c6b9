"""kinbox as a team deploys it: the app module that ``kinbox worker`` is started with.

The outside scenarios (:mod:`kinbox.bench.outside`) run
``kinbox worker kinbox.bench.contenders.deployed:each`` (or ``:batch``), the
command a user types, given only where Kafka and PostgreSQL are: every other
setting is kinbox's default. The run's names (group, schema, topic, effect
table) come from the contender's :class:`~kinbox.bench.spec.ChildSpec` in
the environment, read when the CLI imports the app; the handlers are those of
:mod:`kinbox.bench.contenders.kinbox_runner`.
"""

from __future__ import annotations

import os

from kinbox.app import App
from kinbox.bench.contenders.kinbox_runner import app
from kinbox.bench.spec import ChildSpec
from kinbox.core.errors import ConfigurationError

_KINDS = {"each": False, "batch": True}


def __getattr__(name: str) -> App:
    """``each`` (a per-event handler) or ``batch`` (a batch handler), made on first access.

    Raises:
        AttributeError: another name (as a module without it would).
        ConfigurationError: the spec is not in the environment.
    """
    if name not in _KINDS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    text = os.environ.get(ChildSpec.ENV)
    if text is None:
        raise ConfigurationError(
            f"{__name__}:{name} is the benchmark's app: it needs {ChildSpec.ENV} "
            "(the harness sets it)"
        )
    made = app(ChildSpec.from_json(text), batch=_KINDS[name])
    globals()[name] = made
    return made
