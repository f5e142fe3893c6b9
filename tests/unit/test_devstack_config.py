"""The launcher's overrides: an existing Kafka distribution, and external services."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kinbox.core.errors import ServiceError
from kinbox.devstack.kafka_jars import broker_classpath
from kinbox.devstack.stack import Stack, local_stack


def test_kafka_home_is_used_instead_of_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "kafka_2.13-3.9.1.jar").touch()
    monkeypatch.setenv("KAFKA_HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-cache"))
    assert broker_classpath() == (f"{tmp_path}/libs/*", "3.9.1")
    assert not (tmp_path / "no-cache").exists()  # nothing was resolved


def test_kafka_home_without_a_broker_jar_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_HOME", str(tmp_path))
    with pytest.raises(ServiceError, match=r"no libs/kafka_2\.13"):
        broker_classpath()


def test_external_services_are_used_and_nothing_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KINBOX_TEST_BOOTSTRAP", "broker.example:9092")
    monkeypatch.setenv("KINBOX_TEST_DATABASE_URL", "postgresql://db.example/kinbox")
    with local_stack() as stack:
        assert stack.bootstrap_servers == "broker.example:9092"
        assert stack.database_url == "postgresql://db.example/kinbox"
        assert stack.kafka is None and stack.postgres is None
        assert "external" in stack.describe()


def test_kinbox_dev_brokers_reaches_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kinbox dev --brokers 3`` asks the one launcher for a three-node cluster."""
    from click.testing import CliRunner

    from kinbox.devstack import command

    asked: list[dict[str, object]] = []

    def fake_stack(**options: object) -> Iterator[Stack]:
        asked.append(options)
        raise ServiceError("not starting anything in a unit test")

    monkeypatch.setattr(command, "local_stack", fake_stack)
    result = CliRunner().invoke(command.dev, ["--brokers", "3"])
    assert "not starting anything" in result.output
    assert asked == [
        {"fsync": False, "use_external": False, "cdc": False, "schema_registry": False,
         "brokers": 3}
    ]  # fmt: skip
    assert CliRunner().invoke(command.dev, ["--brokers", "0"]).exit_code == 2


@pytest.fixture
def kafka_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Kafka distribution of one empty jar: brokers are configured, none can run."""
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "kafka_2.13-4.1.1.jar").touch()
    monkeypatch.setenv("KAFKA_HOME", str(tmp_path))  # no jars resolved: nothing runs here
    return tmp_path


@pytest.mark.usefixtures("kafka_home")
def test_a_cluster_node_joins_the_quorum_of_all_nodes() -> None:
    from kinbox.devstack.cluster import KafkaCluster, replication_settings

    assert replication_settings(3)["min.insync.replicas"] == "2"
    assert replication_settings(3)["offsets.topic.replication.factor"] == "3"
    cluster = KafkaCluster(3)
    try:
        configs = [node._config.read_text() for node in cluster.nodes.values()]
        voters = {line for c in configs for line in c.splitlines() if "quorum.voters" in line}
        assert len(voters) == 1 and voters.pop().count("@127.0.0.1:") == 3
        assert all(f"node.id={n}\n" in c for n, c in zip(cluster.nodes, configs, strict=True))
        assert len(cluster.bootstrap_servers.split(",")) == 3
    finally:
        cluster.close()


@pytest.mark.usefixtures("kafka_home")
def test_only_a_measured_broker_runs_the_optimising_compiler() -> None:
    from kinbox.devstack.kafka import KafkaBroker

    quick, steady = KafkaBroker(), KafkaBroker(quick_jit=False)
    try:
        assert "-XX:TieredStopAtLevel=1" in quick._jvm
        assert not any(arg.startswith("-XX:TieredStopAtLevel") for arg in steady._jvm)
        assert steady._jvm[:4] == quick._jvm[:4]  # the same heap and collector
    finally:
        quick.close()
        steady.close()
