"""A newcomer follows "getting started" as written, with the wheel installed in a clean virtualenv.

The wheel is built from this checkout and installed with pip into a fresh
virtualenv (no site packages, no editable install), as ``pip install kinbox``
would. Then the ``sh`` blocks of docs/getting-started.md run in order, in a
directory holding the page's files (from docs_src/getting_started): commands
that run until stopped (the relay, the worker) in the background, the others
to completion. Two lines are stood in for: ``pip install kinbox`` (the wheel)
and ``kinbox dev`` (the session's Kafka and PostgreSQL, with a database of the
test's own). The page's ``python check.py  # [...]`` says what must be printed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from kinbox.devstack.stack import Stack
from tests.conftest import CI

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/getting-started.md"
FILES = ROOT / "docs_src/getting_started"
STOOD_IN = {"pip install kinbox", "kinbox dev"}
RUNS_UNTIL_STOPPED = {"kinbox outbox relay", "kinbox worker app:app"}


def steps() -> list[tuple[str, str]]:
    """Each command of the page's ``sh`` blocks, in order, with its comment."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", PAGE.read_text(), flags=re.DOTALL):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            if command.strip():
                found.append((command.strip(), comment.strip()))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        unavailable(f"building the wheel failed:\n{done.stderr[-2000:]}")
    (built,) = out.glob("kinbox-*.whl")
    return built


def unavailable(why: str) -> None:
    if CI:
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture
def database(stack: Stack) -> Iterator[str]:
    """A database of this test's own on the session's server: the page's tables land there."""
    name = f"newcomer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_conninfo(stack.database_url, dbname=name)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_a_newcomer_gets_a_first_event_applied_by_following_the_page(
    tmp_path: Path, wheel: Path, stack: Stack, database: str
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin/pip"), "install", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if install.returncode != 0:
        unavailable(
            f"pip install of the wheel failed (no package index?):\n{install.stderr[-2000:]}"
        )
    project = tmp_path / "project"
    project.mkdir()
    for source in FILES.glob("*.py"):
        if source.name != "__init__.py":
            (project / source.name).write_text(source.read_text())
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KINBOX_", "PYTEST_", "VIRTUAL_ENV"))
    }
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "KINBOX_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        "KINBOX_DATABASE_URL": database,
    }
    background: list[subprocess.Popen[str]] = []
    logs: list[IO[str]] = []
    ran: list[str] = []
    try:
        for command, comment in steps():
            if command in STOOD_IN:
                continue
            ran.append(command)
            if command in RUNS_UNTIL_STOPPED:
                log = (tmp_path / f"{command.split()[-1].replace(':', '_')}.log").open("w")
                logs.append(log)
                background.append(
                    subprocess.Popen(
                        shlex.split(command),
                        cwd=project,
                        env=env,
                        text=True,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
                continue
            expected = comment if comment.startswith("[") else None
            done = wait_for(command, expected, project, env)
            assert done.returncode in (0, 8), f"{command}:\n{done.stdout}\n{done.stderr}"
            if expected is not None:
                assert expected in done.stdout, f"{command}: {done.stdout!r}"
        assert "kinbox worker app:app" in ran and "python publish.py" in ran
        assert "kinbox migrate" in ran and "python check.py" in ran
    finally:
        for process in background:
            process.terminate()
        for process in background:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for opened in logs:
            opened.close()


def wait_for(
    command: str, expected: str | None, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``command``; while its output lacks ``expected``, again (the worker is catching up)."""
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run(
            shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        if expected is None or expected in done.stdout or time.monotonic() > deadline:
            return done
        time.sleep(0.5)
