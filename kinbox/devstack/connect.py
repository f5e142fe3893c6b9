"""A Kafka Connect worker in distributed mode, with Debezium's PostgreSQL connector.

Distributed mode, even with one worker, because that is how Connect runs in
production: connector configs, source offsets and statuses live in three
internal topics on the broker, so a worker that is SIGKILLed and started again
finds its connector and resumes from the last *committed* source offset (and
re-sends what came after it, which the inbox then drops). The JVM is a child
with a parent-death signal, like the broker, so it never outlives its owner.
"""

from __future__ import annotations

import json
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path

from kinbox.core.errors import ServiceError
from kinbox.devstack.connect_jars import (
    connect_libs,
    connect_version,
    debezium_plugins,
    debezium_version,
    smt_plugin,
)
from kinbox.devstack.process import LocalService, ServiceProcess, free_port, port_open

_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <Console name="STDOUT"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console>
  </Appenders>
  <Loggers>
    <Logger name="io.debezium" level="info"/>
    <Logger name="org.apache.kafka.connect.runtime.WorkerSourceTask" level="info"/>
    <Root level="warn"><AppenderRef ref="STDOUT"/></Root>
  </Loggers>
</Configuration>
"""

POSTGRES_CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"


class KafkaConnect(LocalService):
    """A throwaway Connect worker: ``start()``, ``kill()``, ``stop()``; ``rest_url`` while up.

    Args:
        bootstrap_servers: the broker Connect keeps its internal topics on.
        settings: extra worker properties.
    """

    def __init__(self, bootstrap_servers: str, *, settings: dict[str, str] | None = None) -> None:
        libs = connect_libs()
        self.version = connect_version()
        self.debezium_version = debezium_version()
        plugin_path = [debezium_plugins(), smt_plugin(libs)]
        self.port = free_port()
        super().__init__("kinbox-connect-")
        # One group and one set of internal topics per worker we start: a
        # second `kinbox dev --cdc` on the same broker never joins this one.
        suffix = self._base.name.rsplit("-", 1)[-1]
        self.group_id = f"kinbox-connect-{suffix}"
        log_config = self._base / "log4j2.xml"
        log_config.write_text(_LOG4J2_XML)
        self._jvm = [
            "java", "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log_config}",
            "-cp", f"{libs}/*",
        ]  # fmt: skip
        self._config = self._base / "connect-distributed.properties"
        properties = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": self.group_id,
            "listeners": f"http://127.0.0.1:{self.port}",
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            "plugin.path": ",".join(str(path) for path in plugin_path),
            # Every plugin here ships a ServiceLoader manifest: no class scan at start.
            "plugin.discovery": "service_load",
            "config.storage.topic": f"{self.group_id}-configs",
            "offset.storage.topic": f"{self.group_id}-offsets",
            "status.storage.topic": f"{self.group_id}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            # Source offsets are committed every second: a SIGKILL re-sends at
            # most about a second of records (the inbox drops them).
            "offset.flush.interval.ms": "1000",
            # A SIGKILLed worker's group membership ends in seconds, and its
            # tasks are reassigned at once instead of after the default 5 min.
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "2000",
            "scheduled.rebalance.max.delay.ms": "0",
            # ${env:NAME} in connector configs (the database password).
            "config.providers": "env",
            "config.providers.env.class": (
                "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
            ),
            **(settings or {}),
        }
        self._config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))

    @property
    def rest_url(self) -> str:
        """The worker's REST address, e.g. ``http://127.0.0.1:41234``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> KafkaConnect:
        """Start the worker; wait until its REST API lists the Debezium PostgreSQL plugin."""
        if shutil.which("java") is None:
            raise ServiceError("`java` (17 or newer) is needed to run Kafka Connect")
        self._process = ServiceProcess(
            "kafka-connect",
            [*self._jvm, _MAIN, str(self._config)],
            log_path=self._base / "connect.log",
        )
        self._process.wait_until(self._ready, timeout=timeout, what="serving its REST API")
        return self

    def _ready(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            with urllib.request.urlopen(f"{self.rest_url}/connector-plugins", timeout=2) as reply:
                plugins = json.load(reply)
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return any(plugin.get("class") == POSTGRES_CONNECTOR_CLASS for plugin in plugins)

    def kill(self) -> None:
        """SIGKILL the worker (its topics, offsets and connectors stay on the broker)."""
        if self._process is not None:
            self._process.kill()

    def stop(self) -> None:
        """Stop the worker gracefully (SIGTERM: tasks stop and commit their offsets)."""
        if self._process is not None:
            self._process.stop(signal.SIGTERM, timeout=30)

    @property
    def log_path(self) -> Path | None:
        """The worker's log file, once started."""
        return self._process.log_path if self._process else None
