from __future__ import annotations

import pytest

from kinbox.core.config import Settings, redact_url
from kinbox.core.errors import ConfigurationError

pytestmark = pytest.mark.unit


def valid(**kw: object) -> Settings:
    base: dict[str, object] = {"database_url": "postgresql:///x", "group_id": "g"}
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


def test_defaults_validate_once_required_settings_are_given() -> None:
    s = valid().validate()
    assert s.schema == "kinbox"
    # Debezium's generic `id` is not read unless asked for: many producers
    # put an entity id there, and events of one entity would merge.
    assert s.id_headers == ("event-id", "ce_id")


def test_the_debezium_id_header_is_turned_on_explicitly() -> None:
    env = {"KINBOX_ID_HEADERS": "event-id,ce_id,id"}
    assert Settings.load({}, env).id_headers == ("event-id", "ce_id", "id")
    flags = {"id_headers": ("event-id", "ce_id", "id")}
    assert Settings.load(flags, {}).id_headers == ("event-id", "ce_id", "id")


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
        ({"kafka_overrides": {"max.poll.interval.ms": "soon"}}, "max.poll.interval.ms"),
        ({"kafka_overrides": {"session.timeout.ms": "0"}}, "session.timeout.ms"),
        # -X wins, so the consistency check uses what the consumer will have
        ({"kafka_overrides": {"max.poll.interval.ms": "10000"}}, "session_timeout"),
        ({"kafka_overrides": {"session.timeout.ms": "400000"}}, "session_timeout"),
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


def test_effective_timeouts_are_the_consumers_own() -> None:
    # Given only the settings, they are what the consumer gets
    s = valid(max_poll_interval=120.0, session_timeout=20.0).validate()
    assert (s.effective_max_poll_interval, s.effective_session_timeout) == (120.0, 20.0)
    # When -X sets the librdkafka properties, they win (as in the consumer's config)
    x = valid(
        max_poll_interval=120.0,
        session_timeout=20.0,
        kafka_overrides={"max.poll.interval.ms": "60000", "session.timeout.ms": "7500"},
    ).validate()
    assert (x.effective_max_poll_interval, x.effective_session_timeout) == (60.0, 7.5)


def test_effective_values_match_the_consumer_configuration() -> None:
    from kinbox.kafka.consumer import consumer_config

    s = valid(kafka_overrides={"max.poll.interval.ms": "90000"}).validate()
    config = consumer_config(s)
    assert int(config["max.poll.interval.ms"]) / 1000 == s.effective_max_poll_interval
    assert int(config["session.timeout.ms"]) / 1000 == s.effective_session_timeout


def test_the_consumer_reads_committed_transactions_only_unless_told() -> None:
    from kinbox.kafka.consumer import consumer_config

    # An aborted transaction's records must never reach a handler.
    assert consumer_config(valid().validate())["isolation.level"] == "read_committed"
    uncommitted = valid(kafka_overrides={"isolation.level": "read_uncommitted"}).validate()
    assert consumer_config(uncommitted)["isolation.level"] == "read_uncommitted"


def test_kip848_leaves_the_session_timeout_to_the_broker() -> None:
    # librdkafka refuses session.timeout.ms under group.protocol=consumer, so
    # the settings' value is never compared with the poll interval there
    s = valid(session_timeout=400.0, kafka_overrides={"group.protocol": "consumer"}).validate()
    assert s.effective_max_poll_interval == 300.0


def test_each_member_gets_its_own_static_instance_id() -> None:
    s = valid(kafka_overrides={"group.instance.id": "svc", "acks": "all"}).validate()
    members = [s.for_member(i).kafka_overrides for i in range(3)]
    assert [m["group.instance.id"] for m in members] == ["svc-0", "svc-1", "svc-2"]
    assert all(m["acks"] == "all" for m in members)
    assert s.kafka_overrides["group.instance.id"] == "svc"  # the original is untouched
    # Without static membership nothing changes
    dynamic = valid().validate()
    assert dynamic.for_member(1) is dynamic


def test_each_member_serves_its_metrics_on_a_port_of_its_own() -> None:
    s = Settings(database_url="x", group_id="g", metrics_port=9464).validate()
    assert [s.for_member(i).metrics_port for i in range(3)] == [9464, 9465, 9466]
    assert Settings(database_url="x", group_id="g").for_member(2).metrics_port == 0
    with pytest.raises(ConfigurationError, match="metrics_port=70000"):
        Settings(database_url="x", group_id="g", metrics_port=70000).validate()
    assert Settings.load(env={"KINBOX_METRICS_PORT": "9100"}).metrics_port == 9100
