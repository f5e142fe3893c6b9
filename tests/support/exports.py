"""Checks for a package whose public names load lazily (:mod:`kinbox.core.lazy`)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def type_checking_imports(package: ModuleType) -> set[str]:
    """Names imported under ``if TYPE_CHECKING:`` in the package's ``__init__``."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text())
    (block,) = (
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )  # fmt: skip
    return {
        alias.asname or alias.name
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def assert_exports_complete(
    package: ModuleType, order: Callable[[str], object] | None = None
) -> None:
    """``__all__`` is sorted by ``order`` and names exactly what the package exports.

    Every name resolves, and ``__all__``, the ``TYPE_CHECKING`` imports (what
    type checkers see) and ``_SOURCES`` (what loads at run time) agree.
    """
    exported: list[str] = package.__all__
    assert exported == sorted(exported, key=order)  # type: ignore[arg-type]
    for name in exported:
        assert getattr(package, name) is not None
    assert set(exported) == type_checking_imports(package) == set(package._SOURCES)
    public = {name for name in vars(package) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(package, name), ModuleType)}
    assert set(exported) == public - modules - {"TYPE_CHECKING"}


def fresh_interpreter(code: str) -> str:
    """Run ``code`` in a new Python process from the repository root; return its stdout."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        cwd=ROOT,
    ).stdout  # fmt: skip
