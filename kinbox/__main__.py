"""``python -m kinbox`` is the ``kinbox`` command."""

from kinbox.cli.main import main

main()
