"""The Apache Kafka broker's jars, resolved from Maven Central once and cached.

There is no Kafka package in Debian and the tests may not rely on Docker, but
Maven Central serves the broker itself (``org.apache.kafka:kafka_2.13``) with
its runtime dependencies. A throwaway ``pom.xml`` and ``mvn
dependency:copy-dependencies`` turn that into a folder of jars, kept under the
user's cache directory so later runs start offline. ``KAFKA_HOME`` (an unpacked
Kafka distribution) is used instead when set.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

from kinbox.core.errors import ServiceError

KAFKA_VERSION = "4.1.1"
"""The broker version the local stack runs (override with ``KINBOX_KAFKA_VERSION``)."""

LOG4J_VERSION = "2.25.3"
"""log4j2, the SLF4J binding Kafka's distributions ship (the broker and Connect)."""
SLF4J_VERSION = "2.0.17"
"""SLF4J 2, which Kafka 4 logs through."""

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.kinbox.devstack</groupId>
  <artifactId>kafka-broker-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <!-- Kafka 4 logs through SLF4J 2; log4j2 is the binding its distribution ships. -->
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def cache_root() -> Path:
    """Where kinbox keeps downloaded things: ``$XDG_CACHE_HOME/kinbox`` or ``~/.cache/kinbox``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kinbox"


def kafka_version() -> str:
    """The broker version to run."""
    return os.environ.get("KINBOX_KAFKA_VERSION", KAFKA_VERSION)


def broker_classpath() -> tuple[str, str]:
    """Return ``(classpath, version)`` for the broker, resolving jars if needed."""
    home = os.environ.get("KAFKA_HOME")
    if home:
        libs = Path(home) / "libs"
        jars = sorted(libs.glob("kafka_2.13-*.jar"))
        if not jars:
            raise ServiceError(f"KAFKA_HOME={home!r} has no libs/kafka_2.13-*.jar")
        version = re.sub(r"^kafka_2\.13-|\.jar$", "", jars[0].name)
        return f"{libs}/*", version
    version = kafka_version()
    return f"{resolve_jars(version)}/*", version


def resolve_jars(version: str) -> Path:
    """Download the broker's runtime jars for ``version`` once; return their folder."""
    pom = _POM.format(kafka=version, log4j=LOG4J_VERSION, slf4j=SLF4J_VERSION)
    return resolve_maven(
        cache_root() / f"kafka-{version}",
        pom,
        expect="kafka_2.13-*.jar",
        what=f"org.apache.kafka:kafka_2.13:{version}",
        hint="or set KAFKA_HOME to a Kafka distribution, or KINBOX_TEST_BOOTSTRAP to a broker",
    )


def resolve_maven(root: Path, pom: str, *, expect: str, what: str, hint: str = "") -> Path:
    """Copy the runtime dependencies of ``pom`` into ``root/libs`` once; return that folder.

    Concurrent callers (a test run and ``kinbox dev``) serialise on a lock
    file; a half-finished download is never used because the folder is only
    renamed into place when ``mvn`` succeeded and a jar matching ``expect``
    is there.

    Raises:
        ServiceError: ``mvn`` is missing or failed (its output's tail is quoted).
    """
    libs = root / "libs"
    if libs.is_dir():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError(
            f"the jars of {what} are not cached yet and `mvn` is not on PATH: install Maven"
            + (f", {hint}" if hint else "")
        )
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if libs.is_dir():  # another process finished it while we waited
            return libs
        (root / "pom.xml").write_text(pom)
        staging = root / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        result = subprocess.run(
            [mvn, "-B", "-q", "-f", str(root / "pom.xml"), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={staging}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0 or not any(staging.glob(expect)):
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise ServiceError(
                f"could not resolve {what} with mvn (exit {result.returncode}):\n{tail}"
            )
        staging.rename(libs)
    return libs
