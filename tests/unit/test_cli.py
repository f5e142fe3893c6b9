from __future__ import annotations

import pytest
from click.testing import CliRunner

from kinbox.cli.main import EXIT_CONFIG, EXIT_IMPORT, main

pytestmark = pytest.mark.unit


def test_migrate_sql_prints_ddl_without_connecting() -> None:
    result = CliRunner().invoke(main, ["migrate", "--sql", "--schema", "inbox_x"])
    assert result.exit_code == 0, result.output
    assert 'CREATE TABLE IF NOT EXISTS "inbox_x".processed_events' in result.output
    assert "PRIMARY KEY (consumer, event_id)" in result.output


def test_migrate_sql_rejects_a_bad_schema_name() -> None:
    result = CliRunner().invoke(main, ["migrate", "--sql", "--schema", 'x"; drop'])
    assert result.exit_code == EXIT_CONFIG
    assert "schema" in result.output


def test_worker_with_unimportable_module_exits_with_import_code() -> None:
    result = CliRunner().invoke(main, ["worker", "no_such_module_kinbox_test"])
    assert result.exit_code == EXIT_IMPORT


def test_worker_with_bad_setting_exits_with_config_code_and_hides_password() -> None:
    result = CliRunner().invoke(
        main,
        ["worker", "tests.unit.sample_app:app", "--database-url",
         "postgresql://u:hunter2@h/db", "--batch-max-messages", "0"],
    )  # fmt: skip
    assert result.exit_code == EXIT_CONFIG, result.output
    assert "batch_max_messages" in result.output
    assert "hunter2" not in result.output


def test_bad_x_option() -> None:
    result = CliRunner().invoke(main, ["worker", "tests.unit.sample_app:app", "-X", "novalue"])
    assert result.exit_code == 2


def test_worker_target_names_a_module_or_a_module_and_its_app() -> None:
    from kinbox.ops.worker import load_app
    from tests.unit import sample_app

    assert load_app("tests.unit.sample_app:app") is sample_app.app
    # Without ":app": the module's handlers on the default app if it has any,
    # else the module's `app` attribute.
    assert load_app("tests.unit.sample_app").topics == ["sample-topic"]


def test_worker_target_that_is_not_an_app_is_a_configuration_error() -> None:
    result = CliRunner().invoke(main, ["worker", "tests.unit.sample_app:handle"])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert "not a kinbox App" in result.output


def test_a_module_with_bare_handlers_runs_on_the_default_app() -> None:
    from kinbox.app import default_app
    from kinbox.ops.worker import load_app

    assert load_app("tests.unit.bare_app") is default_app
    assert "bare-topic" in default_app.topics


def test_the_worker_shortens_only_pythons_default_switch_interval() -> None:
    import sys

    from kinbox.ops.worker import SWITCH_INTERVAL, shorten_switch_interval

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        assert shorten_switch_interval() is True
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
        sys.setswitchinterval(0.002)  # the user's own choice is kept
        assert shorten_switch_interval() is False
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)


def test_the_worker_raises_only_pythons_default_gc_thresholds() -> None:
    import gc

    from kinbox.ops.worker import GC_THRESHOLD, tune_gc

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert tune_gc() is True
        assert gc.get_threshold() == GC_THRESHOLD
        gc.set_threshold(2000, 10, 10)  # the user's own choice is kept
        assert tune_gc() is False
        assert gc.get_threshold() == (2000, 10, 10)
        gc.set_threshold(700, 10, 10)
        gc.disable()  # and so is a collector turned off
        try:
            assert tune_gc() is False
            assert gc.get_threshold() == (700, 10, 10)
        finally:
            gc.enable()
    finally:
        gc.set_threshold(*before)


def test_freezing_start_up_leaves_the_collector_only_what_comes_after() -> None:
    import gc

    from kinbox.ops.worker import freeze_start_up

    try:
        freeze_start_up()
        assert gc.get_freeze_count() > 0
        # What the process builds from then on is still collected.
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
