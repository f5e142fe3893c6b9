"""The layout's rules, checked on the source: floors, seams without drivers, no import circle.

The packages stand on floors (see ``kinbox/__init__.py``): the core at the
bottom; the engine and the drivers on it; the outbox library; the shell
(processes, command line, console); the tools (the test kit, the dev stack,
the benchmark); the roof (the ``kinbox`` command). An import never runs back
up, counting every import the source holds: top level, inside functions,
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import benchmarks
import kinbox
import producer_outbox

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = ("confluent_kafka", "psycopg", "psycopg_pool", "opentelemetry")
# Optional libraries a handler may use (the extras): loaded only by a handler
# whose annotations name them, never by registering any other.
OPTIONAL = ("pydantic", "sqlalchemy", "fastavro", "google")

# Each room (a folder, or a module of the package's top level), the floor it
# stands on, and its place on that floor. A room may import the floors its
# floor may (FLOOR_IMPORTS), itself, and the rooms of its own floor placed
# before it: on one floor, no two rooms import each other.
ROOMS: dict[str, tuple[str, int]] = {
    "kinbox.core": ("core", 0),
    "kinbox.params": ("engine", 0),
    "kinbox.middleware": ("engine", 0),
    "kinbox.apply": ("engine", 1),
    "kinbox.app": ("engine", 2),
    "kinbox.consume": ("engine", 3),
    "kinbox": ("engine", 4),  # the public face, kinbox/__init__.py
    "kinbox.kafka": ("drivers", 0),
    "kinbox.store": ("drivers", 0),
    "producer_outbox": ("outbox", 0),
    "kinbox.ops": ("shell", 0),
    "kinbox.console": ("shell", 1),
    "kinbox.cli": ("shell", 2),
    "kinbox.devstack": ("tools", 0),
    "kinbox.testing": ("tools", 1),
    "kinbox.bench": ("tools", 1),
    "benchmarks": ("tools", 2),
    "kinbox.entry": ("roof", 0),
    "kinbox.__main__": ("roof", 1),
}
FLOORS = ("core", "engine", "drivers", "outbox", "shell", "tools", "roof")
FLOOR_IMPORTS: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "engine": frozenset({"core"}),
    "drivers": frozenset({"core"}),
    "outbox": frozenset({"core", "drivers"}),
    "shell": frozenset({"core", "engine", "drivers", "outbox"}),
    "tools": frozenset({"core", "engine", "drivers", "outbox", "shell"}),
    "roof": frozenset({"core", "engine", "drivers", "outbox", "shell", "tools"}),
}
# Which rooms may import a driver's library: the driver, and the floors that
# use the libraries as they are (the outbox library, the tools).
LIBRARY_ROOMS = {
    "confluent_kafka": {"kinbox.kafka"},
    "psycopg": {"kinbox.store"},
    "psycopg_pool": {"kinbox.store"},
}
LIBRARY_FLOORS = {"outbox", "tools", "roof"}
# The core imports the standard library and itself; these, where named.
CORE_LIBRARIES = {
    "tenacity": "kinbox.core.policy",
    "opentelemetry": "kinbox.core.otel",
    "xxhash": "kinbox.core.reuse",
}
CORE_LIBRARIES_LAZY = {"prometheus_client": "kinbox.core.otel"}

ENGINE = ("kinbox.consume", "kinbox.apply", "kinbox.params", "kinbox.middleware")
# The engine's modules that load a library themselves, on demand: pydantic's
# adapter, imported for a handler whose payload type needs it; the telemetry
# middleware (OpenTelemetry), made when the worker starts.
ON_DEMAND = (
    "kinbox.params.validators",
    "kinbox.middleware.telemetry",
    "kinbox.middleware.meters",
    "kinbox.middleware.spans",
)


def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in (kinbox, producer_outbox, benchmarks):
        base = Path(package.__path__[0])
        found[package.__name__] = base / "__init__.py"
        for info in pkgutil.walk_packages([str(base)], prefix=package.__name__ + "."):
            path = base.joinpath(*info.name.split(".")[1:])
            found[info.name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """Each project module ``name`` imports anywhere, and the line: top level, functions, ..."""
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
                yield target, node.lineno


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project's modules ``name`` imports anywhere: top level, functions, TYPE_CHECKING."""
    for target, _ in imported(name, path, known):
        yield target


def libraries(path: Path) -> Iterator[tuple[str, int, bool]]:
    """Each package ``path`` imports (its top-level name), the line, and if at module level."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            sources = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            sources = [node.module or ""]
        else:
            continue
        for source in sources:
            yield source.split(".")[0], node.lineno, id(node) in top


def room_of(name: str) -> str:
    """The room a module stands in: the longest name of :data:`ROOMS` it falls under."""
    if name == "kinbox":
        return "kinbox"
    found = [r for r in ROOMS if r != "kinbox" and (name == r or name.startswith(r + "."))]
    assert found, f"{name} stands in no room of ROOMS: give its folder a floor"
    return max(found, key=len)


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def fresh(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a new interpreter from the repository's root."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        cwd=ROOT,
    )  # fmt: skip


def test_every_module_stands_in_a_room() -> None:
    assert [n for n in modules() if n != "kinbox" and not any(
        n == r or n.startswith(r + ".") for r in ROOMS if r != "kinbox"
    )] == []  # fmt: skip


def test_no_import_runs_back_up_a_floor() -> None:
    known = modules()
    broken = []
    for name, path in sorted(known.items()):
        room = room_of(name)
        floor, place = ROOMS[room]
        for target, line in imported(name, path, known):
            other = room_of(target)
            other_floor, other_place = ROOMS[other]
            if other == room:
                continue
            if other_floor == floor and other_place < place:
                continue
            if other_floor != floor and other_floor in FLOOR_IMPORTS[floor]:
                continue
            below = [f"the {f}" for f in FLOORS if f in FLOOR_IMPORTS[floor]]
            same = sorted(r for r, (f, p) in ROOMS.items() if f == floor and p < place)
            allowed = ", ".join([*below, "itself", *same])
            broken.append(
                f"{where(path, line)} imports {target}: {room} (floor: {floor}) may import "
                f"{allowed}; not {other} (floor: {other_floor})"
            )
    assert broken == [], "imports that run back up:\n" + "\n".join(broken)


def test_nothing_inside_the_packages_imports_the_package_root() -> None:
    # kinbox/__init__.py is the users' face: kinbox's own modules import
    # where a name lives (kinbox.core...), never through it.
    known = modules()
    found = [
        f"{where(path, line)}: {name} imports the package root kinbox"
        for name, path in sorted(known.items())
        for target, line in imported(name, path, known)
        if target == "kinbox"
    ]
    assert found == []


def test_the_driver_libraries_are_imported_by_their_driver_only() -> None:
    # confluent-kafka in kinbox/kafka/, psycopg in kinbox/store/ (and the
    # outbox library and the tools, which use them as they are).
    broken = []
    for name, path in sorted(modules().items()):
        room = room_of(name)
        if ROOMS[room][0] in LIBRARY_FLOORS:
            continue
        for library, line, _ in libraries(path):
            allowed = LIBRARY_ROOMS.get(library)
            if allowed is not None and room not in allowed:
                broken.append(f"{where(path, line)}: {name} imports {library} ({allowed} only)")
    assert broken == []


def producers_made(path: Path) -> Iterator[int]:
    """Each line of ``path`` naming confluent-kafka's ``Producer``: imported, or as an attribute."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if (node.module or "").startswith("confluent_kafka") and any(
                alias.name == "Producer" for alias in node.names
            ):
                yield node.lineno
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "Producer"
            and isinstance(node.value, ast.Name)
            and node.value.id == "confluent_kafka"
        ):
            yield node.lineno


def test_one_publisher_only_the_kafka_driver_makes_a_producer() -> None:
    # Dead letters, replays and the outbox relay all publish through
    # kinbox.kafka's KafkaPublisher; the tools (the benchmark's load) may
    # drive a Producer of their own.
    broken = [
        f"{where(path, line)}: {name} uses confluent-kafka's Producer"
        for name, path in sorted(modules().items())
        if room_of(name) != "kinbox.kafka" and ROOMS[room_of(name)][0] != "tools"
        for line in producers_made(path)
    ]
    assert broken == []


def test_the_outbox_imports_no_kafka_client() -> None:
    # producer_outbox publishes through the Kafka driver, never confluent-kafka itself.
    broken = [
        f"{where(path, line)}: {name} imports confluent_kafka"
        for name, path in sorted(modules().items())
        if room_of(name) == "producer_outbox"
        for library, line, _ in libraries(path)
        if library == "confluent_kafka"
    ]
    assert broken == []


def test_the_core_imports_the_standard_library_and_itself() -> None:
    broken = []
    for name, path in sorted(modules().items()):
        if room_of(name) != "kinbox.core":
            continue
        for library, line, top in libraries(path):
            if library in sys.stdlib_module_names or library in ("kinbox", "__future__"):
                continue
            home = CORE_LIBRARIES.get(library) or (
                None if top else CORE_LIBRARIES_LAZY.get(library)
            )
            if home is None or not (name == home or name.startswith(home + ".")):
                broken.append(f"{where(path, line)}: {name} imports {library}")
    assert broken == []


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


def driver_free() -> list[str]:
    """The core and the engine, found on disk: what must load without a driver."""
    return sorted(
        name
        for name in modules()
        if room_of(name) in ("kinbox.core", "kinbox.app", *ENGINE)
        and not name.startswith("kinbox.core.otel")
        and name not in ON_DEMAND
    )


def test_the_core_and_the_engine_import_no_driver_in_their_source() -> None:
    known = modules()
    offenders = [
        f"{where(known[name], line)}: {name} imports {library}"
        for name in driver_free()
        for library, line, _ in libraries(known[name])
        if library in DRIVERS
    ]
    assert offenders == []


def test_loading_the_core_and_registering_handlers_loads_no_driver() -> None:
    # Given a fresh interpreter, when every driver-free module is imported and
    # handlers registered on an app — plain ones and typed ones that name no
    # optional library — then neither Kafka's nor PostgreSQL's driver nor
    # OpenTelemetry has been loaded, nor pydantic, SQLAlchemy or Avro.
    code = "\n".join(
        [
            "import dataclasses, importlib, sys",
            f"for name in {driver_free()!r}:",
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
    out = fresh(code)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_handler_that_needs_a_driver_loads_none_of_kinbox_s_drivers_when_registered() -> None:
    # Given a fresh interpreter whose user module loaded SQLAlchemy and
    # confluent-kafka's deserializers, when a handler that takes a session and
    # one whose values a confluent-kafka Deserializer reads are registered,
    # then nothing of kinbox's drivers is loaded: the worker adds them.
    code = "\n".join(
        [
            "import sys",
            "from sqlalchemy.orm import Session",
            "from confluent_kafka.serialization import StringDeserializer",
            "from kinbox import App",
            "app = App('g')",
            "@app.handler('sessions')",
            "def hs(payload: bytes, session: Session) -> None: ...",
            "@app.handler('read', value_deserializer=StringDeserializer())",
            "def hr(payload: str) -> None: ...",
            "drivers = ('kinbox.kafka', 'kinbox.store', 'psycopg')",
            "print(sorted(m for m in sys.modules if m.startswith(drivers)))",
        ]
    )
    out = fresh(code)
    assert out.stdout.strip() == "[]", out.stderr


def test_the_worker_resolves_the_default_middleware_when_it_starts() -> None:
    code = (
        "import sys\nfrom kinbox import App\napp = App('g')\n"
        "before = 'opentelemetry' in sys.modules\nlayers = app.middleware\n"
        "print(before, type(layers[0]).__name__, 'opentelemetry' in sys.modules)\n"
    )
    out = fresh(code)
    assert out.stdout.split() == ["False", "Telemetry", "True"]
