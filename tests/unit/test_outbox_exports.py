from __future__ import annotations

import ast
from pathlib import Path

import producer_outbox


def test_all_is_sorted_and_complete() -> None:
    # isort order, as ruff's RUF022 keeps it: CONSTANTS, Classes, functions.
    def order(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert producer_outbox.__all__ == sorted(producer_outbox.__all__, key=order)
    public = {name for name in vars(producer_outbox) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(producer_outbox, name)).__name__ == "module"}
    assert set(producer_outbox.__all__) == public - modules


def test_never_imports_consumer_code() -> None:
    # kinbox.kafka.errors is a leaf (confluent-kafka and the error tree): the
    # one place that reads fatal errors and refused configurations.
    # kinbox.failpoints is the one failpoint grammar, shared and driver-free.
    allowed = {
        "kinbox.errors",
        "kinbox.failpoints",
        "kinbox.kafka.errors",
        "kinbox.names",
        "kinbox.store.migrations",
    }
    package = Path(producer_outbox.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                assert not name.startswith("kinbox") or name in allowed, (path.name, name)
