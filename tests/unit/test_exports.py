from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kinbox

pytestmark = pytest.mark.unit


def _type_checking_imports() -> set[str]:
    """Names imported under ``if TYPE_CHECKING:`` in kinbox/__init__.py."""
    tree = ast.parse(Path(kinbox.__file__).read_text())
    block = next(
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
    assert kinbox.__all__ == sorted(kinbox.__all__)
    # Every name resolves lazily, and the three lists of it agree.
    for name in kinbox.__all__:
        assert getattr(kinbox, name) is not None
    assert set(kinbox.__all__) == _type_checking_imports() == set(kinbox._SOURCES)
    public = {name for name in vars(kinbox) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(kinbox, name)).__name__ == "module"}
    assert set(kinbox.__all__) == public - modules - {"TYPE_CHECKING", "Any"}


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = kinbox.nope


def test_importing_producer_outbox_loads_no_consumer_module() -> None:
    consumer = [
        "kinbox.app", "kinbox.consume.runner", "kinbox.apply.batch", "kinbox.store.postgres",
        "kinbox.kafka.consumer", "kinbox.kafka.producer", "kinbox.kafka.reader", "kinbox.config",
        "kinbox.consume.envelope", "kinbox.event", "kinbox.middleware.base",
        "kinbox.middleware.telemetry", "opentelemetry",
    ]  # fmt: skip
    code = (
        f"import sys, producer_outbox\nprint(sorted(m for m in {consumer!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"


def test_kinbox_testing_exports_every_fake_documented_and_loads_no_kafka_client() -> None:
    # Given a fresh interpreter, when a user's test imports the fakes, then
    # the names are sorted, complete and documented, and librdkafka stays unloaded.
    code = (
        "import sys, types, kinbox.testing as t\n"
        "public = {n for n, v in vars(t).items()\n"
        "          if not n.startswith('_') and not isinstance(v, types.ModuleType)}\n"
        "print(t.__all__ == sorted(t.__all__), public == set(t.__all__),\n"
        "      all(getattr(t, n).__doc__ for n in t.__all__), 'confluent_kafka' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "True", "True", "False"], out.stderr
