"""An Apache Kafka node (KRaft, broker + controller in one JVM) on loopback.

Alone it is a single-node cluster, the local stack's default; three of them
with one controller quorum are :class:`kinbox.devstack.cluster.KafkaCluster`.
The JVM runs from the jars of :mod:`kinbox.devstack.kafka_jars`. The broker can
be killed, paused and restarted on the same ports and data, which the fault
tests need; its advertised port can differ from its listening port, so a TCP
fault proxy can stand in front of it (clients reconnect to the advertised
address, so only then do all their connections pass the proxy).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import uuid

from confluent_kafka.admin import AdminClient

from kinbox.core.errors import ServiceError
from kinbox.devstack.kafka_jars import broker_classpath
from kinbox.devstack.process import LocalService, ServiceProcess, free_port, port_open

_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"

# Quiet logging: warnings and errors to the log file that failures quote.
_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <Console name="STDOUT"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console>
  </Appenders>
  <Loggers>
    <Logger name="kafka.server.KafkaRaftServer" level="info"/>
    <Root level="warn"><AppenderRef ref="STDOUT"/></Root>
  </Loggers>
</Configuration>
"""


def new_cluster_id() -> str:
    """A fresh KRaft cluster id (22 characters, as ``kafka-storage random-uuid`` prints)."""
    return uuid.uuid4().hex[:22]


def _properties(settings: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class KafkaBroker(LocalService):
    """A throwaway Kafka broker: ``start()``, ``kill()``, ``pause()``, ``stop()``.

    Args:
        advertised_port: the port clients are told to use (a fault proxy's);
            defaults to the listening port.
        settings: extra ``server.properties`` entries.
        node_id: this node's id in its cluster.
        controller_port: its controller listener's port (a free one by default).
        voters: the cluster's ``controller.quorum.voters``; by default this
            node alone.
        cluster_id: the id its storage is formatted with (every node of one
            cluster shares it); a fresh one by default.
        heap: the JVM's largest heap (``-Xmx``).
        quick_jit: only the JVM's quick compiler (``-XX:TieredStopAtLevel=1``):
            a start-up of seconds, for tests and ``kinbox dev``. ``False`` lets
            the optimising compiler in too, as on a production broker: once
            warm it serves the same requests with about a third less CPU
            (0.45-0.50 cores against 0.62-0.71 at 1k events/s in and out), but
            it compiles for a minute or two under load first — for a
            long-lived broker that is measured, as the benchmarks' is.
    """

    def __init__(
        self,
        *,
        advertised_port: int | None = None,
        settings: dict[str, str] | None = None,
        node_id: int = 1,
        controller_port: int | None = None,
        voters: str | None = None,
        cluster_id: str | None = None,
        heap: str = "768m",
        quick_jit: bool = True,
    ) -> None:
        self.classpath, self.version = broker_classpath()
        self.node_id = node_id
        self.port = free_port()
        self.controller_port = controller_port or free_port()
        self.advertised_port = advertised_port or self.port
        self._voters = voters or f"{node_id}@127.0.0.1:{self.controller_port}"
        self._cluster_id = cluster_id or new_cluster_id()
        super().__init__("kinbox-kafka-")
        self._config = self._base / "server.properties"
        self._formatted = False
        log_config = self._base / "log4j2.xml"
        log_config.write_text(_LOG4J2_XML)
        jit = ["-XX:TieredStopAtLevel=1"] if quick_jit else []
        self._jvm = [
            "java", "-Xms256m", f"-Xmx{heap}", "-XX:+UseG1GC", *jit,
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log_config}",
            "-cp", self.classpath,
        ]  # fmt: skip
        self._config.write_text(_properties(self._settings(settings or {})))

    def _settings(self, extra: dict[str, str]) -> dict[str, str]:
        return {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.advertised_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.quorum.voters": self._voters,
            "log.dirs": str(self._base / "data"),
            "num.partitions": "3",
            "auto.create.topics.enable": "true",
            # One node: every internal topic has a single replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Fast tests: no 3 s wait before the first rebalance, and short
            # session timeouts allowed, so a SIGKILLed member leaves in seconds.
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.session.timeout.ms": "10000",
            "group.consumer.min.heartbeat.interval.ms": "500",
            "group.consumer.heartbeat.interval.ms": "1000",
            **extra,
        }

    @property
    def bootstrap_servers(self) -> str:
        """The address clients use (the advertised one)."""
        return f"127.0.0.1:{self.advertised_port}"

    def _format_storage(self) -> None:
        result = subprocess.run(
            [*self._jvm, _STORAGE_TOOL, "format", "-t", self._cluster_id, "-c", str(self._config)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise ServiceError(
                f"formatting Kafka storage failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        self._formatted = True

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        """Start the broker (formatting storage the first time); wait until it serves metadata."""
        self.launch()
        self.wait_ready(timeout)
        return self

    def launch(self) -> None:
        """Start the JVM (formatting storage the first time) without waiting for it.

        The nodes of a cluster are launched together: none serves metadata
        before a majority of the controller quorum runs.
        """
        if shutil.which("java") is None:
            raise ServiceError("`java` (17 or newer) is needed to run the Kafka broker")
        if not self._formatted:
            self._format_storage()
        self._process = ServiceProcess(
            f"kafka node {self.node_id}",
            [*self._jvm, _MAIN, str(self._config)],
            log_path=self._base / "broker.log",
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Wait until the launched broker serves metadata (fail if it exits first)."""
        if self._process is None:
            raise ServiceError("the Kafka broker was never launched")
        self._process.wait_until(self._serves_metadata, timeout=timeout, what="serving metadata")

    def _serves_metadata(self) -> bool:
        if not port_open(self.port):
            return False
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{self.port}", "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=2)
        except Exception:  # any failure just means "not yet"
            return False
        return bool(metadata.brokers)

    def kill(self) -> None:
        """SIGKILL the broker (data and ports are kept for ``start()``)."""
        if self._process is not None:
            self._process.kill()

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing answers."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the broker: SIGTERM (controlled shutdown), SIGKILL if it hangs."""
        if self._process is not None:
            self._process.stop(signal.SIGTERM, timeout=20)
