"""``python -m kinbox`` is the ``kinbox`` command."""

from kinbox.entry import main

main()
