"""compose.yaml mirrors the launcher's stack: the same versions and the settings CDC needs.

The project's machines have no Docker, so the compose file never runs here;
this keeps it from drifting from what ``kinbox dev --cdc`` runs and the tests
prove (a version bump in one place and not the other fails here).
"""

from __future__ import annotations

import re
from pathlib import Path

from kinbox.devstack.connect_jars import DEBEZIUM_VERSION
from kinbox.devstack.kafka_jars import KAFKA_VERSION
from producer_outbox.debezium import PASSWORD_PLACEHOLDER

COMPOSE = (Path(__file__).resolve().parents[2] / "compose.yaml").read_text()


def _service(name: str) -> str:
    """The text of one service's block (up to the next top-level service)."""
    match = re.search(rf"^  {name}:\n(.*?)(?=^  \S|\Z)", COMPOSE, re.MULTILINE | re.DOTALL)
    assert match, f"no service {name!r} in compose.yaml"
    return match.group(1)


def test_images_are_the_versions_the_launcher_runs() -> None:
    assert f"image: apache/kafka:{KAFKA_VERSION}" in _service("kafka")
    assert f"image: quay.io/debezium/connect:{DEBEZIUM_VERSION}" in _service("connect")


def test_postgres_decodes_logically_and_connect_is_the_cdc_profile() -> None:
    assert '"wal_level=logical"' in _service("postgres")
    connect = _service("connect")
    assert 'profiles: ["cdc"]' in connect
    # The connector config's password placeholder needs the env provider and the variable.
    variable = PASSWORD_PLACEHOLDER.removeprefix("${env:").removesuffix("}")
    assert "CONNECT_CONFIG_PROVIDERS: env" in connect and f"{variable}:" in connect
    assert "/kafka/connect/kinbox-connect-smt" in connect  # kinbox's header transform
