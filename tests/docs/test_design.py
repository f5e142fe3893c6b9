"""Code that cites an invariant of docs/design.md cites one the page has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"(?:docs/design\.md,?|DESIGN)\s+invariants?\s+(\d+)")


def test_every_cited_invariant_is_numbered_on_the_design_page() -> None:
    numbered = {
        int(n) for n in re.findall(r"^(\d+)\. \*\*", (ROOT / "docs/design.md").read_text(), re.M)
    }
    cited = {
        (str(path.relative_to(ROOT)), int(n))
        for folder in ("kinbox", "producer_outbox", "tests")
        for path in (ROOT / folder).rglob("*.py")
        for n in CITATION.findall(path.read_text())
    }

    assert numbered == set(range(1, len(numbered) + 1))
    assert cited and all(n in numbered for _, n in cited), sorted(cited)
