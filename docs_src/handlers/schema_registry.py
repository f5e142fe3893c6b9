from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from pydantic import BaseModel

from kinbox import App

app = App(group_id="orders-service")
registry = SchemaRegistryClient(
    {"url": "http://registry:8081"}
)  # pip install 'kinbox[schema-registry]'


class Order(BaseModel):
    orderId: str
    total: int


@app.handler("orders", value_deserializer=AvroDeserializer(registry))
def order_placed(order: Order, tx) -> None:
    tx.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (order.orderId, order.total))
