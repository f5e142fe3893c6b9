"""The layout's rules, checked on the source: seams without drivers, no import circle."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import kinbox
import producer_outbox

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = ("confluent_kafka", "psycopg", "psycopg_pool", "opentelemetry")
# Optional libraries a handler may use (the extras): loaded only by a handler
# whose annotations name them, never by registering any other.
OPTIONAL = ("pydantic", "sqlalchemy", "fastavro", "google")
# The core: everything a record passes through between the seams. It may
# depend on the seams (kafka.base, store.base), never on what is behind them.
CORE_PACKAGES = ("kinbox.consume", "kinbox.apply", "kinbox.params")
CORE_MODULES = (
    "kinbox.app",
    "kinbox.core.config",
    "kinbox.core.describe",
    "kinbox.core.errors",
    "kinbox.core.event",
    "kinbox.core.names",
    "kinbox.core.transport",
    "kinbox.core.inbox",
    "kinbox.middleware.base",
)
# Loaded only for a handler whose annotations name the optional library.
ON_DEMAND = ("kinbox.params.validators",)


def modules() -> dict[str, Path]:
    """Every module of both packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in (kinbox, producer_outbox):
        base = Path(package.__path__[0])
        found[package.__name__] = base / "__init__.py"
        for info in pkgutil.walk_packages([str(base)], prefix=package.__name__ + "."):
            path = base.joinpath(*info.name.split(".")[1:])
            found[info.name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project's modules ``name`` imports anywhere: top level, functions, TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            # `from pkg import mod` imports the module pkg.mod, not just pkg.
            targets = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in known else source
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def test_no_import_cycle_even_counting_type_only_and_function_level_imports() -> None:
    known = modules()
    graph = {name: sorted(set(imports(name, path, known))) for name, path in known.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def core_modules() -> list[str]:
    """The core's modules, found on disk so a new one is covered without editing this test."""
    names = [n for n in modules() if n.startswith(tuple(p + "." for p in CORE_PACKAGES))]
    return sorted({*CORE_PACKAGES, *names, *CORE_MODULES})


def test_core_imports_no_driver_in_its_source() -> None:
    known = modules()
    offenders = []
    for name in core_modules():
        tree = ast.parse(known[name].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                sources = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                sources = [node.module or ""]
            else:
                continue
            offenders += [f"{name}: {s}" for s in sources if s.split(".")[0] in DRIVERS]
    assert offenders == []


def test_loading_the_core_and_registering_handlers_loads_no_driver() -> None:
    # Given a fresh interpreter, when every core module is imported and
    # handlers registered on an app — plain ones and typed ones that name no
    # optional library — then neither Kafka's nor PostgreSQL's driver nor
    # OpenTelemetry has been loaded, nor pydantic, SQLAlchemy or Avro.
    code = "\n".join(
        [
            "import dataclasses, importlib, sys",
            f"for name in {[n for n in core_modules() if n not in ON_DEMAND]!r}:",
            "    importlib.import_module(name)",
            "from kinbox import App, Event, handler",
            "app = App('g')",
            "@app.handler('lesson-events')",
            "def h(event: Event, tx: object) -> None: ...",
            "@handler('other-events', batch=True)",
            "def hb(events: list[Event], tx: object) -> None: ...",
            "@dataclasses.dataclass",
            "class Lesson:",
            "    userId: str",
            "@app.handler('typed')",
            "def ht(payload: Lesson, tx: object, event: Event) -> None: ...",
            "@app.handler('typed-batch', batch=True)",
            "def htb(payloads: list[Lesson], events: list[Event]) -> None: ...",
            "@app.handler('raw', value_deserializer=bytes.decode)",
            "def hr(payload: str) -> None: ...",
            "@app.handler('dicts')",
            "def hd(payload: dict[str, object], tx: object) -> None: ...",
            "heavy = {*" + repr(DRIVERS) + ", *" + repr(OPTIONAL) + "}",
            "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))",
        ]
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        cwd=ROOT,
    )  # fmt: skip
    assert out.stdout.strip() == "[]", out.stderr


def test_the_worker_resolves_the_default_middleware_when_it_starts() -> None:
    code = (
        "import sys\nfrom kinbox import App\napp = App('g')\n"
        "before = 'opentelemetry' in sys.modules\nlayers = app.middleware\n"
        "print(before, type(layers[0]).__name__, 'opentelemetry' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        cwd=ROOT,
    )  # fmt: skip
    assert out.stdout.split() == ["False", "Telemetry", "True"]
