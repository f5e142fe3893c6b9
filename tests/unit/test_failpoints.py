"""The one failpoint grammar (kinbox.core.failpoints), shared by the worker and the relay."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import kinbox
import producer_outbox
from kinbox.core import failpoints
from kinbox.core.errors import ConfigurationError
from kinbox.core.failpoints import Failpoint, FailpointError, Failpoints, parse
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Signals a ``kill`` failpoint sends, instead of sending them."""
    sent: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(sig))
    return sent


@pytest.mark.parametrize(
    ("spec", "armed"),
    [
        (None, {}),
        ("", {}),
        (" , ", {}),
        ("after_db_commit=kill@3", {"after_db_commit": ("kill", 3)}),
        ("relay_after_publish=raise", {"relay_after_publish": ("raise", 1)}),
        (
            " after_db_commit = kill @ 3 , before_db_commit=kill@1,",
            {"after_db_commit": ("kill", 3), "before_db_commit": ("kill", 1)},
        ),
        ("relay_after_publish=kill@12", {"relay_after_publish": ("kill", 12)}),
        ("before_db_commit=pause", {"before_db_commit": ("pause", 1)}),
    ],
)
def test_good_specs(spec: str | None, armed: dict[str, tuple[str, int]]) -> None:
    points = parse(spec)
    assert {name: (p.action, p.nth) for name, p in points.items()} == armed
    assert all(p == Failpoint(name, p.action, p.nth) for name, p in points.items())


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("after_db_commit", "is not allowed: use name=kill|raise"),
        ("after_db_commit=", "is not allowed"),
        ("after_db_commit=explode@1", "is not allowed"),
        ("after_db_commit=kill@", "is not allowed"),
        ("after_db_commit=kill@0", "n >= 1"),
        ("after_db_commit=kill@-1", "is not allowed"),
        ("after_db_commit=kill@x", "is not allowed"),
        ("after_db_commit=kill@1@2", "is not allowed"),
        ("=kill@1", "names no failpoint"),
        ("after_db_comit=kill@1", r"names no failpoint: use one of \['after_db_commit'"),
        ("after_db_commit=kill@1,after_db_commit=raise", "arms 'after_db_commit' twice"),
    ],
)
def test_bad_specs_name_the_variable_and_the_entry(spec: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=f"KINBOX_FAILPOINTS.*{says}"):
        parse(spec)


def test_kill_fires_on_the_nth_pass_only(kills: list[int]) -> None:
    points = Failpoints("after_db_commit=kill@3, before_db_commit=kill@1")
    points.hit("after_db_commit")
    points.hit("after_db_commit")
    points.hit("relay_after_publish")
    assert kills == []
    points.hit("after_db_commit")
    assert kills == [signal.SIGKILL]
    points.hit("after_db_commit")
    assert kills == [signal.SIGKILL], "fires once"
    points.hit("before_db_commit")
    assert kills == [signal.SIGKILL, signal.SIGKILL]


def test_raise_fires_once_on_its_pass(kills: list[int]) -> None:
    points = Failpoints("relay_after_publish=raise@2")
    points.hit("relay_after_publish")
    with pytest.raises(FailpointError, match="'relay_after_publish' fired on pass 2"):
        points.hit("relay_after_publish")
    points.hit("relay_after_publish")
    assert kills == []


def test_pause_holds_its_thread_until_the_failpoints_are_armed_again() -> None:
    points = Failpoints("before_db_commit=pause@2")
    points.hit("before_db_commit")  # pass 1 goes through
    passed = threading.Event()

    def second_pass() -> None:
        points.hit("before_db_commit")
        passed.set()

    thread = threading.Thread(target=second_pass, daemon=True)
    thread.start()
    wait_for(lambda: points.held("before_db_commit"), 10, "the second pass held")
    assert not passed.is_set()
    # When the points are armed again (here: disarmed), the held thread goes on
    points.arm(None)
    thread.join(10)
    assert passed.is_set() and not points.held("before_db_commit")


def test_a_bad_spec_leaves_nothing_armed(kills: list[int]) -> None:
    points = Failpoints("before_db_commit=kill@1")
    with pytest.raises(ConfigurationError):
        points.arm("before_db_commit=kill@1,nope=kill")
    points.hit("before_db_commit")
    assert kills == []


def test_the_process_failpoints_rearm_and_reset_counts(kills: list[int]) -> None:
    try:
        failpoints.configure("after_db_commit=kill@2")
        failpoints.failpoint("after_db_commit")
        failpoints.configure("after_db_commit=kill@2")  # counts start again
        failpoints.failpoint("after_db_commit")
        assert kills == []
        failpoints.failpoint("after_db_commit")
        assert kills == [signal.SIGKILL]
    finally:
        failpoints.configure(None)


def test_a_bad_environment_fails_at_start_up() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import kinbox.core.failpoints"],
        env={**os.environ, "KINBOX_FAILPOINTS": "relay_after_publsh=kill@2"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "ConfigurationError" in out.stderr and "relay_after_publsh" in out.stderr


def _failpoint_calls() -> Iterator[tuple[str, str]]:
    """``(file, name)`` of every ``failpoint("name")`` call in both packages."""
    for package in (kinbox, producer_outbox):
        for path in Path(package.__path__[0]).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "failpoint"
                ):
                    (arg,) = node.args
                    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), path
                    yield path.name, arg.value


def test_every_failpoint_in_the_code_is_named_in_the_grammar_and_back() -> None:
    used = {name for _, name in _failpoint_calls()}
    assert used == set(failpoints.NAMES)
