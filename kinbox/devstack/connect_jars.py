"""Kafka Connect, the Debezium PostgreSQL connector and kinbox's header transform, as jars.

Resolved from Maven Central with ``mvn`` once and cached next to the broker's
jars (see :func:`kinbox.devstack.kafka_jars.resolve_maven`):

- the Connect worker: ``org.apache.kafka:connect-runtime`` with ``connect-json``
  and ``connect-transforms`` (``connect-api`` comes with them), on the JVM's
  classpath;
- Debezium's PostgreSQL connector, one release for all its artifacts, as a
  plugin directory on Connect's ``plugin.path``. Kafka's own jars are left out
  of it: Connect provides them, and a second copy inside a plugin only invites
  class-loading surprises;
- ``dev.kinbox.connect.ExpandJsonHeader`` (``producer_outbox/java``), compiled
  with ``javac`` against that Connect worker's jars into a plugin of its own
  (:mod:`producer_outbox.connect_plugin`).

Connect's version is the Kafka version the Debezium release is built and
tested against (its ``version.kafka``), not the broker's: a Connect worker
talks to newer and older brokers alike.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from kinbox.core.errors import ConnectorError, ServiceError
from kinbox.devstack.kafka_jars import LOG4J_VERSION, SLF4J_VERSION, cache_root, resolve_maven
from producer_outbox.connect_plugin import SMT_SOURCE, build_smt_jar

DEBEZIUM_VERSION = "3.6.1.Final"
"""The Debezium release (override with ``KINBOX_DEBEZIUM_VERSION``)."""

CONNECT_VERSION = "4.3.0"
"""Kafka Connect: what Debezium 3.6.1.Final builds against (``KINBOX_CONNECT_VERSION``)."""


_CONNECT_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.kinbox.devstack</groupId>
  <artifactId>kafka-connect-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId>
      <version>{connect}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>connect-json</artifactId>
      <version>{connect}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>connect-transforms</artifactId>
      <version>{connect}</version>
    </dependency>
    <!-- connect-runtime still names SLF4J 1.7; the log4j2 binding needs SLF4J 2. -->
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

_DEBEZIUM_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.kinbox.devstack</groupId>
  <artifactId>debezium-postgres-plugin</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>io.debezium</groupId><artifactId>debezium-connector-postgres</artifactId>
      <version>{debezium}</version>
      <exclusions>
        <!-- The Connect worker provides these (parent-first in plugin isolation). -->
        <exclusion><groupId>org.apache.kafka</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>org.slf4j</groupId><artifactId>*</artifactId></exclusion>
      </exclusions>
    </dependency>
  </dependencies>
</project>
"""


def debezium_version() -> str:
    """The Debezium release to run."""
    return os.environ.get("KINBOX_DEBEZIUM_VERSION", DEBEZIUM_VERSION)


def connect_version() -> str:
    """The Kafka Connect version to run."""
    return os.environ.get("KINBOX_CONNECT_VERSION", CONNECT_VERSION)


def connect_libs(version: str | None = None) -> Path:
    """The Connect worker's jars (resolved once); put ``<folder>/*`` on the classpath."""
    version = version or connect_version()
    pom = _CONNECT_POM.format(connect=version, log4j=LOG4J_VERSION, slf4j=SLF4J_VERSION)
    return resolve_maven(
        cache_root() / f"connect-{version}",
        pom,
        expect="connect-runtime-*.jar",
        what=f"org.apache.kafka:connect-runtime:{version}",
    )


def debezium_plugins(version: str | None = None) -> Path:
    """A ``plugin.path`` entry holding Debezium's PostgreSQL connector (resolved once).

    The folder's only sub-directory is the plugin (``libs``); the ``pom.xml``
    and lock file beside it are not archives, so Connect skips them.
    """
    version = version or debezium_version()
    libs = resolve_maven(
        cache_root() / f"debezium-postgres-{version}",
        _DEBEZIUM_POM.format(debezium=version),
        expect="debezium-connector-postgres-*.jar",
        what=f"io.debezium:debezium-connector-postgres:{version}",
    )
    return libs.parent


def smt_plugin(connect: Path | None = None) -> Path:
    """A ``plugin.path`` entry holding kinbox's ``ExpandJsonHeader``, compiled once per source.

    The cache key is a hash of the Java source and the Connect version, so
    an edited source is rebuilt and never mixed up with an old jar.

    Raises:
        ServiceError: ``javac``/``jar`` are missing (a JDK is needed, not just a JRE)
            or the build failed.
    """
    connect = connect or connect_libs()
    sources = sorted(SMT_SOURCE.glob("*.java"))
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.read_bytes())
    digest.update(str(connect).encode())
    root = cache_root() / f"kinbox-connect-smt-{digest.hexdigest()[:12]}"
    plugin = root / "kinbox-connect-smt"
    if plugin.is_dir():
        return root
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not plugin.is_dir():
            staging = Path(tempfile.mkdtemp(prefix="smt-", dir=root))
            try:
                try:
                    build_smt_jar(connect, staging / "kinbox-connect-smt.jar")
                except ConnectorError as exc:
                    raise ServiceError(str(exc)) from exc
                staging.rename(plugin)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return root
