"""Schema Registry payloads: confluent-kafka's serializers in, kinbox's handler deserializers out.

Against a real registry with Confluent's API: Apicurio Registry, started by
kinbox.devstack for this module (Confluent's own registry is not on Maven
Central). A producer serializes with confluent-kafka's Avro and JSON Schema
serializers, registering the schema; a kinbox worker decodes each value with
the handler's deserializer into its typed payload.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kinbox.core.errors import Retry, ServiceError
from kinbox.core.event import Event
from kinbox.devstack.process import free_port
from kinbox.devstack.registry import SchemaRegistry, start_registry
from kinbox.devstack.stack import Stack
from kinbox.kafka.serde import reader
from tests.conftest import STACK_LINES, MakeTopic, cannot_start
from tests.integration.failure_support import dead_letters, header, running, statuses
from tests.integration.inbox_support import committed, effects, settings
from tests.integration.typed_support import Line, Order, fresh_app, insert_effect, produce_values
from tests.support.database import Conn
from tests.support.waiting import wait_for

ORDER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "int"}],
    }
)
LINE_JSON_SCHEMA = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Line",
        "type": "object",
        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
        "required": ["sku", "qty"],
    }
)


@pytest.fixture(scope="module")
def registry() -> Iterator[SchemaRegistry]:
    """A real schema registry (Apicurio, Confluent's API) for this module's tests."""
    try:
        service = start_registry()
    except ServiceError as exc:
        cannot_start("the schema registry (Apicurio Registry)", exc)
    STACK_LINES.append(f"Apicurio Registry {service.version} (pid {service.pid}) at {service.url}")
    yield service
    service.close()


@pytest.fixture
def client(registry: SchemaRegistry) -> Iterator[SchemaRegistryClient]:
    """A client of the registry, closed after the test (its HTTP connections with it)."""
    with SchemaRegistryClient({"url": registry.url}) as registry_client:
        yield registry_client


def serialized(serializer: Any, topic: str, value: object) -> bytes:
    data = serializer(value, SerializationContext(topic, MessageField.VALUE))
    assert isinstance(data, bytes)
    return data


def test_avro_into_a_pydantic_model_and_bad_records_dead_lettered(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, client: SchemaRegistryClient
) -> None:
    # Given records Avro-serialized against the registry, a record with a bad
    # magic byte and one naming a schema id the registry does not know
    app, topic, group = fresh_app(stack, make_topic, schema)
    avro = AvroSerializer(client, ORDER_AVRO)
    orders = [serialized(avro, topic, {"order_id": f"o{i}", "amount": i}) for i in range(3)]
    unknown_id = b"\x00" + (987654).to_bytes(4, "big") + orders[0][5:]
    records = [("e0", orders[0]), ("magic", b"{not avro}"), ("e1", orders[1])]
    records += [("unknown", unknown_id), ("e2", orders[2])]
    produce_values(stack.bootstrap_servers, topic, records)

    # ... and a handler that takes an Order, decoded by the registry's Avro deserializer
    got: list[Order] = []

    @app.handler(topic, value_deserializer=AvroDeserializer(client), max_attempts=5)
    def apply(order: Order, tx: Any, event: Event) -> None:
        got.append(order)
        tx.execute(
            insert_effect(schema),
            (group, f"{event.id}:{order.order_id}:{order.amount}", topic, 0, event.offset),
        )

    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)

    # When a worker consumes them
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 5})

    # Then the typed values reached the handler and were applied once each ...
    assert all(isinstance(order, Order) for order in got)
    assert [row[1] for row in effects(db, schema)] == ["e0:o0:0", "e1:o1:1", "e2:o2:2"]
    # ... and the two bad records were dead-lettered at once, with reason payload
    status = statuses(db, schema, group)
    assert status["magic"][0] == status["unknown"][0] == "dead_lettered"
    letters = {header(r, "event-id"): r for r in dead_letters(config, f"{topic}.dlq")}
    assert set(letters) == {"magic", "unknown"}
    for letter in letters.values():
        assert header(letter, "kinbox.dlq.reason") == "payload"
        assert header(letter, "kinbox.dlq.attempts") == "1"
    assert "magic byte" in (header(letters["magic"], "kinbox.dlq.error.message") or "")
    assert "404" in (header(letters["unknown"], "kinbox.dlq.error.message") or "")


def test_json_schema_into_a_dataclass_as_the_app_default(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, client: SchemaRegistryClient
) -> None:
    # Given records serialized with a registered JSON Schema, one of them invalid
    deserializer = JSONDeserializer(None, schema_registry_client=client)
    app, topic, group = fresh_app(stack, make_topic, schema, value_deserializer=deserializer)
    serializer = JSONSerializer(LINE_JSON_SCHEMA, client)
    good = [serialized(serializer, topic, {"sku": f"s{i}", "qty": i}) for i in range(2)]
    # Framed like the others, but its document breaks the schema (qty is text)
    invalid = good[0][:5] + b'{"sku": "s9", "qty": "nine"}'
    produce_values(
        stack.bootstrap_servers, topic, [("l0", good[0]), ("invalid", invalid), ("l1", good[1])]
    )

    # ... and the registry's JSON deserializer as the App's default for typed handlers
    @app.handler(topic)
    def apply(line: Line, tx: Any, event: Event) -> None:
        assert isinstance(line, Line)
        tx.execute(insert_effect(schema), (group, f"{event.id}:{line.sku}x{line.qty}", topic, 0, 0))

    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)

    # When a worker consumes them
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 3})

    # Then the valid lines are applied as dataclasses, the invalid one dead-lettered
    assert [row[1] for row in effects(db, schema)] == ["l0:s0x0", "l1:s1x1"]
    [letter] = dead_letters(config, f"{topic}.dlq")
    assert header(letter, "event-id") == "invalid"
    assert header(letter, "kinbox.dlq.reason") == "payload"


def test_an_unreachable_registry_is_a_retry_not_a_dead_letter() -> None:
    # Given a record framed for schema id 1 and a deserializer whose registry is not there
    event = Event(id="e", topic="t", partition=0, offset=0, key=None,
                  value=b"\x00\x00\x00\x00\x01\x02a")  # fmt: skip
    url = f"http://127.0.0.1:{free_port()}"
    with SchemaRegistryClient({"url": url, "max.retries": 0}) as nowhere:
        read = reader(AvroDeserializer(nowhere))

        # Then reading it asks for a retry: the record is not to blame
        with pytest.raises(Retry, match="schema registry"):
            read(event)
