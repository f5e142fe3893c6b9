"""`kinbox dev --cdc`: Kafka Connect with Debezium beside Kafka and PostgreSQL; nothing left."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

from producer_outbox.connect_plugin import SMT_CLASS
from producer_outbox.debezium import CONNECTOR_CLASS
from tests.integration.test_devstack_lifecycle import _children, _wait_gone, running_dev


def test_dev_cdc_serves_connect_with_debezium_and_kinbox_transform_then_leaves_nothing() -> None:
    with running_dev("--cdc") as (process, env):
        services = _children(process.pid)
        assert len(services) == 3, services  # the broker's JVM, the postmaster, Connect's JVM

        # The printed REST address serves the Debezium connector and kinbox's transform
        url = f"{env['KINBOX_CONNECT_URL']}/connector-plugins?connectorsOnly=false"
        with urllib.request.urlopen(url, timeout=10) as reply:
            plugins = {plugin["class"]: plugin for plugin in json.load(reply)}
        assert plugins[CONNECTOR_CLASS]["version"].startswith("3.6.1")
        assert plugins[SMT_CLASS]["type"] == "transformation"

        # When the dev process is killed outright, nothing outlives it
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        assert _wait_gone(services) == []
