"""Markers by directory: tests/unit needs no services; integration and faults need the stack."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
"""In CI a service that cannot start fails the run; elsewhere it skips the tests that need it."""

_ROOT = Path(__file__).parent

STACK_LINES: list[str] = []
"""What the integration fixtures started (versions, pids, addresses), printed at the end."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(_ROOT).parts
        if parts and parts[0] in {"unit", "integration", "faults", "examples"}:
            item.add_marker(parts[0] if parts[0] != "examples" else "integration")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which real services the integration tests run against (filled in when they start)."""
    from kinbox.devstack.kafka_jars import kafka_version
    from kinbox.devstack.stack import EXTERNAL_DATABASE_ENV, EXTERNAL_KAFKA_ENV

    kafka = os.environ.get(EXTERNAL_KAFKA_ENV) or f"Apache Kafka {kafka_version()} (JVM, local)"
    postgres = os.environ.get(EXTERNAL_DATABASE_ENV) or "PostgreSQL (local private cluster)"
    return [f"kinbox stack: {kafka}; {postgres}; CI={CI}"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print which real Kafka broker and PostgreSQL server the tests ran against."""
    if STACK_LINES:
        terminalreporter.section("kinbox stack")
        for line in STACK_LINES:
            terminalreporter.write_line(line)
