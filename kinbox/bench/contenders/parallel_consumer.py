"""Confluent's parallel-consumer 0.5.3.2 in KEY order: the slow-keys scenario's Java contender.

``java/SlowKeys.java`` (beside this module) consumes the topic with
parallel-consumer, ``ordering=KEY`` and ``maxConcurrency`` = the scenario's
key concurrency, and applies each record in a PostgreSQL transaction of its
own over JDBC (the same wait and effect row as kinbox's handlers), one
connection per concurrent record. It is at-least-once: parallel-consumer
commits offsets of finished records on its own timer.

Its jars come from Maven Central once, one artifact at a time
(``mvn dependency:get -Dtransitive=false``) into ``~/.cache/kinbox``:
parallel-consumer's POM names a test dependency Maven Central does not
serve, so its runtime set is listed here instead of resolved from it. The
program is compiled with ``javac`` into the same cache, keyed by its
source, and this process then becomes the JVM (``exec``): the harness's
SIGTERM, CPU time and peak RSS are the JVM's own.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from kinbox.bench import effects
from kinbox.bench.spec import ChildSpec
from kinbox.core.errors import KinboxError
from kinbox.devstack.kafka_jars import SLF4J_VERSION, cache_root

VERSION = "0.5.3.2"
"""The parallel-consumer release."""

JARS = (
    f"io.confluent.parallelconsumer:parallel-consumer-core:{VERSION}",
    # What its POMs name for runtime (kafka-clients at the version it is built against).
    "org.apache.kafka:kafka-clients:3.7.0",
    "org.lz4:lz4-java:1.8.0",
    "org.xerial.snappy:snappy-java:1.1.10.5",
    "com.github.luben:zstd-jni:1.5.5-4",
    "io.micrometer:micrometer-core:1.13.0",
    "io.micrometer:micrometer-commons:1.13.0",
    "io.micrometer:micrometer-observation:1.13.0",
    "org.hdrhistogram:HdrHistogram:2.2.1",
    "org.latencyutils:LatencyUtils:2.0.3",
    "pl.tlinkowski.unij:pl.tlinkowski.unij.api:0.1.3",
    "pl.tlinkowski.unij:pl.tlinkowski.unij.service.api:0.1.3",
    "pl.tlinkowski.unij:pl.tlinkowski.unij.service.collect.jdk8:0.1.3",
    "pl.tlinkowski.unij:pl.tlinkowski.unij.service.misc.jdk8:0.1.3",
    f"org.slf4j:slf4j-api:{SLF4J_VERSION}",
    f"org.slf4j:slf4j-simple:{SLF4J_VERSION}",
    # The handler's database.
    "org.postgresql:postgresql:42.7.11",
)
"""Every jar on the program's classpath, as ``group:artifact:version``."""

SOURCE = Path(__file__).resolve().parent / "java" / "SlowKeys.java"
MAIN = "dev.kinbox.bench.SlowKeys"


def _local_jar(coordinate: str) -> Path:
    group, artifact, version = coordinate.split(":")
    repo = Path(os.environ.get("MAVEN_REPOSITORY", Path.home() / ".m2" / "repository"))
    return repo.joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")


def jars() -> Path:
    """The folder of :data:`JARS`, fetched once; put ``<folder>/*`` on the classpath.

    Raises:
        KinboxError: ``mvn`` is missing or could not fetch an artifact.
    """
    digest = hashlib.sha256("\n".join(JARS).encode()).hexdigest()[:12]
    root = cache_root() / f"parallel-consumer-{VERSION}-{digest}"
    libs = root / "libs"
    if libs.is_dir():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KinboxError("the parallel-consumer contender needs `mvn` (Maven) to fetch its jars")
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if libs.is_dir():
            return libs
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=root))
        try:
            for coordinate in JARS:
                done = subprocess.run(
                    [mvn, "-B", "-q", "dependency:get", "-Dtransitive=false",
                     f"-Dartifact={coordinate}"],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                jar = _local_jar(coordinate)
                if done.returncode != 0 or not jar.is_file():
                    tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
                    raise KinboxError(f"mvn could not fetch {coordinate}:\n{tail}")
                shutil.copy2(jar, staging / jar.name)
            staging.rename(libs)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return libs


def compiled(libs: Path) -> Path:
    """``SlowKeys.java`` compiled against ``libs``, once per source; return the classes folder.

    Raises:
        KinboxError: no ``javac`` (a JDK is needed), or the build failed.
    """
    digest = hashlib.sha256(SOURCE.read_bytes() + str(libs).encode()).hexdigest()[:12]
    classes = cache_root() / f"slowkeys-{digest}"
    if classes.is_dir():
        return classes
    javac = shutil.which("javac")
    if javac is None:
        raise KinboxError("the parallel-consumer contender needs a JDK (`javac`, 17 or newer)")
    staging = Path(tempfile.mkdtemp(prefix="slowkeys-", dir=cache_root()))
    try:
        done = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-cp", f"{libs}/*", "-d", str(staging),
             str(SOURCE)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise KinboxError(f"javac failed on {SOURCE.name}:\n{done.stdout}{done.stderr}")
        try:
            staging.rename(classes)
        except OSError:
            if not classes.is_dir():  # another process put the same build in place first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return classes


def jdbc(database_url: str) -> tuple[str, str, str | None]:
    """``(JDBC URL, user, password)`` of a libpq URL or connection string (TCP only).

    Raises:
        KinboxError: the database is reached through a Unix socket, which JDBC cannot.
    """
    parts = conninfo_to_dict(database_url)
    host = str(parts.get("host") or "localhost")
    if host.startswith("/"):
        raise KinboxError("the parallel-consumer contender reaches PostgreSQL over TCP only")
    port = parts.get("port") or "5432"
    user = str(parts.get("user") or os.environ.get("USER", "postgres"))
    password = parts.get("password")
    url = f"jdbc:postgresql://{host}:{port}/{parts.get('dbname') or user}"
    return url, user, None if password is None else str(password)


def environment(spec: ChildSpec) -> dict[str, str]:
    """What ``SlowKeys`` reads: where to connect, what to write, how wide, how many."""
    url, user, password = jdbc(spec.database_url)
    insert = sql.SQL("INSERT INTO {}.{} ({}) VALUES (?, ?, ?, ?, ?, ?)").format(
        sql.Identifier(spec.schema), sql.Identifier(spec.table),
        sql.SQL(", ").join(sql.Identifier(c) for c in effects.COLUMNS),
    )  # fmt: skip
    env = {
        "SLOWKEYS_BOOTSTRAP": spec.bootstrap_servers,
        "SLOWKEYS_GROUP": spec.group,
        "SLOWKEYS_TOPIC": spec.topic,
        "SLOWKEYS_JDBC_URL": url,
        "SLOWKEYS_DB_USER": user,
        "SLOWKEYS_INSERT": insert.as_string(None),
        "SLOWKEYS_CONCURRENCY": spec.extra["concurrency"],
        "SLOWKEYS_SLEEP_S": spec.extra["sleep_s"],
        "SLOWKEYS_EXPECTED": spec.extra["expected"],
        # librdkafka's -X properties, passed on by name (security settings share them).
        "SLOWKEYS_KAFKA": "\n".join(f"{k}={v}" for k, v in spec.kafka.items()),
    }
    if password is not None:
        env["SLOWKEYS_DB_PASSWORD"] = password
    return env


def run(spec: ChildSpec) -> None:
    """Fetch and build what is missing, then become the JVM running ``SlowKeys``."""
    java = shutil.which("java")
    if java is None:
        raise KinboxError("the parallel-consumer contender needs Java (17 or newer)")
    libs = jars()
    classes = compiled(libs)
    os.environ.update(environment(spec))
    argv = [
        java, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp", f"{classes}:{libs}/*", MAIN,
    ]  # fmt: skip
    os.execv(java, argv)
