from kinbox import App, Event

app = App(group_id="stock-service")


# The producer keys orders by SKU: one SKU's reservations stay in order,
# different SKUs' are applied side by side, sixteen at a time.
@app.handler("orders", ordering="key", concurrency=16)
def reserve(event: Event, tx) -> None:
    order = event.json()
    tx.execute(  # waits on the SKU's row lock while another order of it commits
        "UPDATE stock SET reserved = reserved + %s WHERE sku = %s",
        (order["qty"], order["sku"]),
    )
    tx.execute(
        "INSERT INTO reservations (sku, order_id) VALUES (%s, %s)",
        (order["sku"], order["id"]),
    )
