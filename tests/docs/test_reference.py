"""The generated reference pages match the code: a new flag or setting fails here until written."""

from __future__ import annotations

import pytest

from docs_tools import reference

pytestmark = pytest.mark.unit


def test_the_committed_reference_pages_are_what_the_code_gives() -> None:
    stale = [str(p.relative_to(reference.ROOT)) for p in reference.stale()]
    assert stale == [], f"{stale} are stale: run `make docs-reference` and commit them"


def test_every_setting_has_a_description() -> None:
    page = reference.configuration_page()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert rows and all(not line.rstrip().endswith("|  |") for line in rows), page
