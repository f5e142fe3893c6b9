from kinbox import App, Event, caused_by
from producer_outbox import enqueue

app = App(group_id="billing-service")


@app.handler("orders", batch=True)
def on_orders(events: list[Event], tx) -> None:
    for event in events:
        with caused_by(event):  # kinbox explain then links each invoice to its order
            enqueue(tx, "invoices", {"orderId": event.json()["orderId"]})
