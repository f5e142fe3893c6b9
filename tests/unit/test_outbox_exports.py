from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import producer_outbox

ROOT = Path(__file__).resolve().parents[2]


def _type_checking_imports() -> set[str]:
    """Names imported under ``if TYPE_CHECKING:`` in producer_outbox/__init__.py."""
    tree = ast.parse(Path(producer_outbox.__file__).read_text())
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


def test_all_is_sorted_and_complete() -> None:
    # isort order, as ruff's RUF022 keeps it: CONSTANTS, Classes, functions.
    def order(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert producer_outbox.__all__ == sorted(producer_outbox.__all__, key=order)
    # Every name resolves lazily, and the three lists of it agree.
    for name in producer_outbox.__all__:
        assert getattr(producer_outbox, name) is not None
    assert set(producer_outbox.__all__) == _type_checking_imports() == set(producer_outbox._SOURCES)
    public = {name for name in vars(producer_outbox) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(producer_outbox, name)).__name__ == "module"}
    assert set(producer_outbox.__all__) == public - modules - {"TYPE_CHECKING", "Any"}


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = producer_outbox.nope


def test_a_writer_loads_psycopg_and_nothing_of_kafka_or_the_relay() -> None:
    # Given a fresh interpreter, when a writer-only service imports enqueue,
    # then psycopg is loaded, and neither confluent-kafka, nor kinbox's Kafka
    # seam, nor any producer_outbox module beyond the writer's own.
    writer = {"producer_outbox", "producer_outbox.writer", "producer_outbox.schema"}
    writer |= {"producer_outbox.debezium"}  # the CDC constraint's name, in the writer's errors
    code = (
        "import sys\nfrom producer_outbox import enqueue\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('confluent_kafka', 'kinbox.kafka', 'producer_outbox', 'psycopg'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        cwd=ROOT,
    )  # fmt: skip
    loaded = set(ast.literal_eval(out.stdout))
    assert "psycopg" in loaded
    assert not {m for m in loaded if m.startswith(("confluent_kafka", "kinbox.kafka"))}
    assert {m for m in loaded if m.startswith("producer_outbox")} == writer


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
