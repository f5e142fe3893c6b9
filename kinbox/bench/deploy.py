"""Starting a contender as a team deploys it: kinbox through its command line, with its defaults.

kinbox is started as ``kinbox worker <module:app> --bootstrap-servers …
--database-url …`` (the console script beside this interpreter, or ``python
-m kinbox`` without one), plus the target's ``-X`` properties: nothing
else, so every other setting is kinbox's default. The environment's
``KINBOX_*`` settings are left out, so a tuned shell cannot tune the run.
A hand-written contender runs its entry point in a process of its own
(:func:`kinbox.bench.process.start_contender`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from kinbox.bench.contenders import Contender
from kinbox.bench.process import Child, start_contender
from kinbox.bench.spec import ChildSpec
from kinbox.core.config import ENV_PREFIX

KEPT = ("KINBOX_FAILPOINTS",)
"""``KINBOX_*`` variables a deployed worker keeps (set by the harness, not by a shell)."""


def kinbox_command() -> list[str]:
    """The ``kinbox`` command of this interpreter's installation."""
    script = Path(sys.executable).with_name("kinbox")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "kinbox"]


def worker_argv(app: str, spec: ChildSpec) -> list[str]:
    """``kinbox worker APP`` given only where Kafka and PostgreSQL are (and the target's ``-X``)."""
    argv = [
        *kinbox_command(), "worker", app,
        "--bootstrap-servers", spec.bootstrap_servers, "--database-url", spec.database_url,
    ]  # fmt: skip
    for key, value in spec.kafka.items():
        argv += ["-X", f"{key}={value}"]
    return argv


def start(
    contender: Contender,
    spec: ChildSpec,
    name: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Start ``contender`` as deployed: ``kinbox worker`` for kinbox, its own process otherwise.

    Args:
        contender: what to start.
        spec: its names (group, topic, schema, table); a kinbox app reads
            them from the environment (:mod:`kinbox.bench.contenders.deployed`).
        name: the process's name in logs.
        log_dir: where its log goes.
        env: more environment (the worker's stage stamps, say).
    """
    if contender.app is None:
        return start_contender(spec, name, log_dir, env=env)
    return Child(
        name,
        worker_argv(contender.app, spec),
        log_dir / f"{name}.log",
        {ChildSpec.ENV: spec.to_json(), **(env or {})},
        base=untuned(os.environ),
    )


def untuned(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the ``KINBOX_*`` settings a shell may hold (but :data:`KEPT`)."""
    return {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX) or k in KEPT}
