"""``python -m kinbox.bench.child``: one contender's consumer process.

Reads its :class:`~kinbox.bench.spec.ChildSpec` from ``KINBOX_BENCH_SPEC``,
runs the contender until SIGTERM, exits 0. ``KINBOX_FAILPOINTS`` arms the
kill between database commit and offset commit (every contender calls
:func:`kinbox.core.failpoints.failpoint` there).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from kinbox.bench.spec import ChildSpec


def main() -> None:
    """Run the contender named in the spec."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    spec = ChildSpec.from_json(os.environ[ChildSpec.ENV])
    module, _, function = spec.entry.partition(":")
    getattr(importlib.import_module(module), function)(spec)


if __name__ == "__main__":
    main()
