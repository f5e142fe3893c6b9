"""kinbox's Kafka Connect transform, built from source into a plugin jar.

``producer_outbox/java/ExpandJsonHeader.java`` turns the outbox's ``headers``
column (one JSON object per row) into one Kafka header per entry, which
neither Debezium's router nor Connect's own transforms can do. It is shipped
as source and compiled with the JDK against the Connect worker's own jars, so
it never disagrees with the Connect version that loads it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from kinbox.core.errors import ConnectorError

SMT_CLASS = "dev.kinbox.connect.ExpandJsonHeader"
"""The transformation that turns the outbox's ``headers`` column into Kafka headers."""

SMT_SOURCE = Path(__file__).resolve().parent / "java"
"""Where its Java source lives (inside the package, so installs carry it)."""


def build_smt_jar(connect: Path, jar_path: Path) -> Path:
    """Compile ``ExpandJsonHeader`` against the jars in ``connect`` into ``jar_path``.

    ``connect`` is a Connect worker's jar folder (``libs/`` of a Kafka
    distribution, ``/kafka/libs`` in Debezium's image): the transform then
    uses exactly the Connect API and Jackson that run it. The jar carries a
    ``META-INF/services`` entry, so Connect finds the transformation with
    ``plugin.discovery=service_load`` (no class scanning).

    Raises:
        ConnectorError: no ``javac``/``jar`` (a JDK is needed, not just a JRE),
            no Connect API in ``connect``, or the build failed.
    """
    if not any(connect.glob("connect-api-*.jar")):
        raise ConnectorError(f"{connect} holds no connect-api-*.jar: not a Connect worker's libs")
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise ConnectorError(
            "building kinbox's Kafka Connect transformation needs a JDK (`javac` and `jar`, "
            "17 or newer): install openjdk-17-jdk-headless"
        )
    sources = sorted(str(path) for path in SMT_SOURCE.glob("*.java"))
    with tempfile.TemporaryDirectory(prefix="kinbox-smt-") as work:
        classes = Path(work) / "classes"
        services = classes / "META-INF" / "services"
        services.mkdir(parents=True)
        (services / "org.apache.kafka.connect.transforms.Transformation").write_text(
            SMT_CLASS + "\n"
        )
        _run([javac, "--release", "17", "-nowarn", "-cp", f"{connect}/*", "-d", str(classes),
              *sources], "javac")  # fmt: skip
        jar_path.parent.mkdir(parents=True, exist_ok=True)
        _run([jar, "--create", "--file", str(jar_path), "-C", str(classes), "."], "jar")
    return jar_path


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ConnectorError(
            f"{what} failed building kinbox's Connect transformation ({result.returncode}):\n"
            f"{result.stdout}{result.stderr}"
        )
