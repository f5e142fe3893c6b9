from __future__ import annotations

import os
import signal

import pytest

from kinbox import failpoints
from kinbox.errors import ConfigurationError

pytestmark = pytest.mark.unit


def test_kills_on_the_nth_hit_only(monkeypatch: pytest.MonkeyPatch) -> None:
    kills: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append(sig))
    failpoints.configure("after_db_commit=kill@3, before_db_commit=kill@1")
    try:
        failpoints.failpoint("after_db_commit")
        failpoints.failpoint("after_db_commit")
        failpoints.failpoint("other")
        assert kills == []
        failpoints.failpoint("after_db_commit")
        assert kills == [signal.SIGKILL]
        failpoints.failpoint("after_db_commit")
        assert kills == [signal.SIGKILL]
    finally:
        failpoints.configure(None)


@pytest.mark.parametrize("spec", ["x", "x=kill", "x=kill@0", "x=explode@1", "=kill@1"])
def test_bad_spec(spec: str) -> None:
    with pytest.raises(ConfigurationError, match="KINBOX_FAILPOINTS"):
        failpoints.configure(spec)
    failpoints.configure(None)
