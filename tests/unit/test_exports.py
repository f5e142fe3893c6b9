from __future__ import annotations

import pytest

import kinbox

pytestmark = pytest.mark.unit


def test_all_is_sorted_and_complete() -> None:
    assert kinbox.__all__ == sorted(kinbox.__all__)
    public = {name for name in vars(kinbox) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(kinbox, name)).__name__ == "module"}
    assert set(kinbox.__all__) == public - modules
