"""``python -m kinbox.cli`` is the ``kinbox`` command, like ``python -m kinbox``."""

from kinbox.cli.main import main

main()
