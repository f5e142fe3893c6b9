"""`kinbox outbox connect-plugin` builds kinbox's Connect transform from its Java source."""

from __future__ import annotations

import zipfile
from pathlib import Path

from click.testing import CliRunner

from kinbox.cli.outbox import outbox
from kinbox.core.errors import ServiceError
from kinbox.devstack.connect_jars import connect_libs
from producer_outbox.connect_plugin import SMT_CLASS
from tests.conftest import cannot_start


def test_connect_plugin_builds_a_jar_connect_can_discover(tmp_path: Path) -> None:
    try:
        libs = connect_libs()
    except ServiceError as exc:
        cannot_start("Kafka Connect's jars", exc)
    result = CliRunner().invoke(
        outbox, ["connect-plugin", "--connect-libs", str(libs), "--output", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    jar = tmp_path / "kinbox-connect-smt" / "kinbox-connect-smt.jar"
    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
        services = archive.read(
            "META-INF/services/org.apache.kafka.connect.transforms.Transformation"
        )
    assert SMT_CLASS.replace(".", "/") + ".class" in names
    assert services.decode().split() == [SMT_CLASS]


def test_connect_plugin_refuses_a_folder_without_the_connect_api(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        outbox, ["connect-plugin", "--connect-libs", str(tmp_path), "--output", str(tmp_path)]
    )
    assert result.exit_code == 1
    assert "connect-api" in result.output
