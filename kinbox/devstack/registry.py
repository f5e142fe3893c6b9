"""A schema registry with Confluent's REST API: Apicurio Registry, from Maven Central.

Confluent's Schema Registry is not on Maven Central; Apicurio Registry is
(``io.apicurio:apicurio-registry-app``), and it serves the Confluent Schema
Registry API under ``/apis/ccompat/v7`` — what confluent-kafka's
``SchemaRegistryClient`` and its Avro, Protobuf and JSON Schema serializers
speak. It is a Quarkus application: the plain jar on Maven Central is its
classes only, but the release also publishes the runnable "fast-jar" layout as
``apicurio-registry-app-<v>-all.tar.gz``. That archive is resolved with
``mvn`` once (like the broker's jars, :func:`~kinbox.devstack.kafka_jars.resolve_maven`),
unpacked into the cache, and run with ``java -jar quarkus-run.jar``. Its
storage is in memory (its default, H2), so every start is empty.

Apicurio Registry 3 is built for Java 21: :func:`registry_java` looks for a
JDK of 21 or newer (``KINBOX_REGISTRY_JAVA``, ``JAVA_HOME``, ``java`` on
``PATH``, then ``/usr/lib/jvm/*``). ``KINBOX_APICURIO_VERSION`` picks another
release.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from kinbox.core.errors import ServiceError
from kinbox.devstack.kafka_jars import cache_root, resolve_maven
from kinbox.devstack.process import LocalService, ServiceProcess, free_port, port_open

APICURIO_VERSION = "3.3.3"
"""The Apicurio Registry release (override with ``KINBOX_APICURIO_VERSION``)."""

MIN_JAVA = 21
CCOMPAT_PATH = "/apis/ccompat/v7"
"""Where Apicurio serves the Confluent-compatible API."""

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.kinbox.devstack</groupId>
  <artifactId>apicurio-registry-dist</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <!-- The runnable distribution only: its libraries are inside the archive. -->
    <dependency>
      <groupId>io.apicurio</groupId><artifactId>apicurio-registry-app</artifactId>
      <version>{version}</version><type>tar.gz</type><classifier>all</classifier>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>
    </dependency>
  </dependencies>
</project>
"""


def apicurio_version() -> str:
    """The Apicurio Registry release to run."""
    return os.environ.get("KINBOX_APICURIO_VERSION", APICURIO_VERSION)


def registry_dist(version: str) -> Path:
    """The unpacked fast-jar of Apicurio Registry ``version`` (resolved and unpacked once).

    Raises:
        ServiceError: ``mvn`` is missing or could not resolve the archive.
    """
    root = cache_root() / f"apicurio-registry-{version}"
    dist = root / "dist"
    if (dist / "quarkus-run.jar").is_file():
        return dist
    libs = resolve_maven(
        root,
        _POM.format(version=version),
        expect="apicurio-registry-app-*.tar.gz",
        what=f"io.apicurio:apicurio-registry-app:{version}:tar.gz:all",
    )
    with (root / ".unpack-lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dist / "quarkus-run.jar").is_file():  # another process unpacked it meanwhile
            return dist
        staging = root / "dist.partial"
        shutil.rmtree(staging, ignore_errors=True)
        for archive in libs.glob("apicurio-registry-app-*.tar.gz"):
            with tarfile.open(archive) as tar:
                tar.extractall(staging, filter="data")
        if not (staging / "quarkus-run.jar").is_file():
            raise ServiceError(f"{libs} holds no Apicurio fast-jar (no quarkus-run.jar inside)")
        staging.rename(dist)
        for archive in libs.glob("*.tar.gz"):
            archive.unlink()  # unpacked: the 150 MB archive need not stay twice (Maven keeps one)
    return dist


def java_major(java: str) -> int | None:
    """The major version of the ``java`` binary at ``java`` (``None`` if it does not run)."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


def registry_java() -> str:
    """A ``java`` binary of version 21 or newer.

    Raises:
        ServiceError: none was found (the message lists what was tried).
    """
    candidates = [os.environ.get("KINBOX_REGISTRY_JAVA", "")]
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    candidates.append(shutil.which("java") or "")
    candidates += [str(p) for p in sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)]
    tried = []
    for java in dict.fromkeys(c for c in candidates if c):
        major = java_major(java)
        tried.append(f"{java} ({major or 'does not run'})")
        if major is not None and major >= MIN_JAVA:
            return java
    raise ServiceError(
        f"Apicurio Registry needs Java {MIN_JAVA} or newer; tried: {', '.join(tried) or 'none'}; "
        "set KINBOX_REGISTRY_JAVA to a java binary"
    )


class SchemaRegistry(LocalService):
    """A throwaway Apicurio Registry: ``start()``, ``stop()``; ``url`` is its Confluent API.

    Args:
        version: the Apicurio release (default :func:`apicurio_version`).
    """

    def __init__(self, version: str | None = None) -> None:
        self.version = version or apicurio_version()
        self._dist = registry_dist(self.version)
        self._java = registry_java()
        self.port = free_port()
        self._management_port = free_port()
        super().__init__("kinbox-registry-")

    @property
    def url(self) -> str:
        """The Confluent-compatible API: give it to ``SchemaRegistryClient({"url": ...})``."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def start(self, timeout: float = 240.0) -> SchemaRegistry:
        """Start the registry; wait until its Confluent API answers."""
        properties = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            # Its health and metrics endpoints, on a port of their own (default 9000 on
            # every interface): two registries, or anything else on 9000, must not clash.
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": str(self._management_port),
            "quarkus.http.access-log.enabled": "false",
            "quarkus.otel.sdk.disabled": "true",
        }
        argv = [
            self._java, "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            *(f"-D{name}={value}" for name, value in properties.items()),
            "-jar", str(self._dist / "quarkus-run.jar"),
        ]  # fmt: skip
        self._process = ServiceProcess(
            "apicurio-registry", argv, log_path=self._base / "registry.log", cwd=self._base
        )
        self._process.wait_until(self._ready, timeout=timeout, what="serving its Confluent API")
        return self

    def _ready(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as reply:
                return isinstance(json.load(reply), list)
        except (OSError, ValueError, urllib.error.URLError):
            return False


def start_registry() -> SchemaRegistry:
    """Start a schema registry; close it if it cannot start.

    Raises:
        ServiceError: it could not be resolved, found no Java 21+, or did not start.
    """
    registry = SchemaRegistry()
    try:
        registry.start()
    except BaseException:
        registry.close()
        raise
    return registry
