"""A user's project in a temporary directory, tested by its own pytest run in a child process.

kinbox is installed there as it is here, so the ``pytest11`` entry point
registers kinbox's plugin exactly as it does for a team that ran ``pip install
kinbox``; the project has no conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment without pytest's and the test stack's variables, plus ``extra``.

    ``URL_FILE`` names a file a child test may write the database URL to.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KINBOX_TEST_"))}
    return {**env, "URL_FILE": str(tmp_path / "url"), **extra}


def run_pytest(
    project: Path, files: dict[str, str], env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Write ``files`` (name -> source) into ``project`` and run pytest there."""
    for name, source in files.items():
        (project / name).write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
