"""The ``kinbox`` command: the shell's group, with the tools' commands mounted on it.

:func:`kinbox.cli.main.main` is the command line of the people who run
kinbox (``worker``, ``migrate``, ``status``, ``dlq``, ``outbox``...); ``kinbox
dev`` (:mod:`kinbox.devstack.command`) and ``kinbox bench``
(:mod:`kinbox.bench.command`) are the tools', mounted here, on the roof, so
that nothing below imports them. ``kinbox`` (the installed script) and
``python -m kinbox`` both run :func:`main`.
"""

from __future__ import annotations

from kinbox.bench.command import bench
from kinbox.cli.main import main
from kinbox.devstack.command import dev

__all__ = ["main"]

main.add_command(bench)
main.add_command(dev)
