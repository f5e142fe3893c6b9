from kinbox import App, DeadLetter, Event

app = App(group_id="ledger-service")


# An account's postings must be applied in order: once one is dead-lettered,
# the account's later postings wait for it instead of overtaking it.
@app.handler("postings", park_keys=True)
def post(event: Event, tx) -> None:
    posting = event.json()
    row = tx.execute("SELECT 1 FROM accounts WHERE id = %s", (posting["account"],)).fetchone()
    if row is None:
        raise DeadLetter(f"no account {posting['account']}")
    tx.execute(
        "UPDATE accounts SET balance = balance + %s WHERE id = %s",
        (posting["amount"], posting["account"]),
    )
