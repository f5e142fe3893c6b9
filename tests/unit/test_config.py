from __future__ import annotations

import pytest

from kinbox.config import Settings, redact_url
from kinbox.errors import ConfigurationError

pytestmark = pytest.mark.unit


def valid(**kw: object) -> Settings:
    base: dict[str, object] = {"database_url": "postgresql:///x", "group_id": "g"}
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


def test_defaults_validate_once_required_settings_are_given() -> None:
    s = valid().validate()
    assert s.schema == "kinbox"
    assert s.id_headers == ("event-id", "ce_id", "id")


def test_flags_beat_env_beat_base() -> None:
    base = Settings(group_id="from-app", batch_max_messages=10)
    env = {"KINBOX_GROUP_ID": "from-env", "KINBOX_BATCH_MAX_MESSAGES": "20",
           "KINBOX_ID_HEADERS": "a, b", "KINBOX_BATCH_MAX_WAIT": "0.5"}  # fmt: skip
    s = Settings.load({"group_id": "from-flag", "schema": None}, env, base)
    assert s.group_id == "from-flag"
    assert s.batch_max_messages == 20
    assert s.id_headers == ("a", "b")
    assert s.batch_max_wait == 0.5
    assert s.schema == "kinbox"


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="KINBOX_BATCH_MAX_MESSAGES='many'"):
        Settings.load(env={"KINBOX_BATCH_MAX_MESSAGES": "many"})


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"group_id": ""}, "group_id"),
        ({"database_url": ""}, "database_url"),
        ({"schema": "Bad-Name"}, "schema"),
        ({"batch_max_messages": 0}, "batch_max_messages"),
        ({"batch_max_wait": 0}, "batch_max_wait"),
        ({"id_headers": ()}, "id_headers"),
        ({"session_timeout": 600.0}, "session_timeout"),
        ({"kafka_overrides": {"enable.auto.commit": "true"}}, "enable.auto.commit"),
        ({"kafka_overrides": {"group.id": "x"}}, "group.id"),
    ],
)
def test_validate_names_the_bad_setting(change: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        valid(**change).validate()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://kin:s3cret@db:5432/app",
        "host=db user=kin password=s3cret dbname=app",
        "host=db password='s3 cret' dbname=app",
        "postgresql://kin@db/app?password=s3cret&sslmode=require",
    ],
)
def test_passwords_never_appear(url: str) -> None:
    s = valid(database_url=url, kafka_overrides={"sasl.password": "s3cret", "acks": "all"})
    assert "s3cret" not in repr(s)
    assert "s3" not in redact_url(url).replace("sslmode", "")
    assert s.redacted()["kafka_overrides"] == {"sasl.password": "***", "acks": "all"}
