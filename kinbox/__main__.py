"""``python -m kinbox`` is the ``kinbox`` command."""

from kinbox.cli import main

main()
