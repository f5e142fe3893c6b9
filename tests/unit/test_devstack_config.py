"""The launcher's overrides: an existing Kafka distribution, and external services."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.devstack.kafka_jars import broker_classpath
from kinbox.devstack.stack import local_stack
from kinbox.errors import ServiceError


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
