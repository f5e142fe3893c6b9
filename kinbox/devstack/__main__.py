"""``python -m kinbox.devstack`` is ``kinbox dev``."""

from kinbox.devstack.command import dev

dev()
